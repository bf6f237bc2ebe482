"""SimEngine: batching limit, FIFO admission, prefix-cache timing, withdrawal, KV limits."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.sim import SimConfig, SimEngine
from gateway.sim.generation import EngineStopped, Generation
from gateway.sim.kvcache import PromptTooLong

pytestmark = pytest.mark.anyio

# Fast steps, no per-token prefill cost unless a test asks for one.
FAST: dict[str, Any] = {"step_s": 0.001, "step_s_per_seq": 0.0, "prefill_s_per_token": 0.0}


@contextlib.asynccontextmanager
async def running_engine(**settings: Any) -> AsyncIterator[SimEngine]:
    """A started engine with FAST timings overridden by `settings`, stopped afterwards."""
    engine = SimEngine(SimConfig(**{**FAST, **settings}))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def drain(generation: Generation) -> list[str]:
    return [token async for token in generation]


async def test_never_more_than_max_num_seqs_sequences_run_at_once() -> None:
    """Requests beyond max_num_seqs wait; the batch fills up to the limit and no further."""
    async with running_engine(max_num_seqs=3) as engine:
        seen: list[tuple[int, int]] = []

        async def consume(generation: Generation) -> None:
            async for _ in generation:
                seen.append((engine.running, engine.waiting))

        generations = [engine.submit("prompt", max_tokens=3) for _ in range(10)]
        await asyncio.gather(*(consume(g) for g in generations))
        assert max(running for running, _ in seen) == 3
        assert (3, 7) in seen
        assert engine.stats().requests_finished == 10
        assert (engine.running, engine.waiting) == (0, 0)


async def test_waiting_requests_are_admitted_in_submission_order() -> None:
    """The waiting queue is FIFO."""
    async with running_engine(max_num_seqs=1) as engine:
        generations = [engine.submit(f"prompt {i}", max_tokens=2) for i in range(5)]
        await asyncio.gather(*(drain(g) for g in generations))
        admitted = [g.admitted_at for g in generations]
        assert all(t is not None for t in admitted)
        assert admitted == sorted(admitted, key=lambda t: t or 0.0)
        assert len(set(admitted)) == len(admitted)


async def test_every_request_gets_exactly_max_tokens_tokens() -> None:
    """A generation yields max_tokens tokens, or the configured default without one."""
    async with running_engine(default_max_tokens=4) as engine:
        explicit, default = engine.submit("a", max_tokens=7), engine.submit("b")
        assert len(await drain(explicit)) == 7
        assert len(await drain(default)) == 4
        assert explicit.state == "finished"
        assert explicit.completion_tokens == 7


async def test_ttft_is_higher_when_the_prompt_misses_the_prefix_cache() -> None:
    """The second identical prompt skips its cached prefill and gets its first token sooner."""
    async with running_engine(prefill_s_per_token=0.00005, chars_per_token=1) as engine:
        prompt = "p" * 1024  # 1024 tokens, 64 full blocks: 51 ms of prefill when cold
        cold = engine.submit(prompt, max_tokens=1)
        await drain(cold)
        warm = engine.submit(prompt, max_tokens=1)
        await drain(warm)
        assert cold.cached_prompt_tokens == 0
        # Every block hits, but the last prompt token is always computed (as in vLLM).
        assert warm.cached_prompt_tokens == 1023
        assert cold.ttft_s is not None
        assert warm.ttft_s is not None
        assert cold.ttft_s > warm.ttft_s


async def test_prefix_cache_counters_count_tokens_like_vllm() -> None:
    """Queries count every admitted prompt token; hits count the cached ones."""
    async with running_engine(chars_per_token=1, block_size_tokens=4) as engine:
        await drain(engine.submit("abcdefghij", max_tokens=1))  # 10 tokens, 2 full blocks
        shared = engine.submit("abcdefgh-other", max_tokens=1)  # shares both blocks
        await drain(shared)
        stats = engine.stats()
        assert shared.cached_prompt_tokens == 8
        assert stats.prefix_cache_query_tokens == 10 + 14
        assert stats.prefix_cache_hit_tokens == 8


async def test_prefix_caching_can_be_turned_off() -> None:
    """With prefix_cache_blocks=0 a repeated prompt is computed again."""
    async with running_engine(prefix_cache_blocks=0, chars_per_token=1) as engine:
        await drain(engine.submit("x" * 64, max_tokens=1))
        again = engine.submit("x" * 64, max_tokens=1)
        await drain(again)
        assert again.cached_prompt_tokens == 0


async def test_a_withdrawn_request_leaves_the_queue_and_the_batch_at_once() -> None:
    """cancel() frees a waiting position or a running slot immediately."""
    async with running_engine(max_num_seqs=1, step_s=0.01) as engine:
        first = engine.submit("a", max_tokens=1000)
        second = engine.submit("b", max_tokens=1000)
        await anext(first)
        assert (engine.running, engine.waiting) == (1, 1)
        second.cancel()
        assert (engine.running, engine.waiting) == (1, 0)
        first.cancel()
        assert (engine.running, engine.waiting) == (0, 0)
        assert first.state == second.state == "cancelled"
        assert engine.stats().requests_cancelled == 2
        assert await drain(second) == []


async def test_cancelling_the_consumer_task_withdraws_its_request() -> None:
    """A consumer cancelled mid-stream (client gone) no longer occupies a batch slot."""
    async with running_engine(step_s=0.01) as engine:
        generation = engine.submit("a", max_tokens=1000)
        first_token = asyncio.Event()

        async def consume() -> None:
            async for _ in generation:
                first_token.set()

        task = asyncio.create_task(consume())
        await first_token.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.running == 0
        assert generation.state == "cancelled"


async def test_leaving_async_with_withdraws_the_request() -> None:
    """A Generation used as an async context manager cannot leak its slot."""
    async with running_engine(step_s=0.01) as engine:
        async with engine.submit("a", max_tokens=1000) as generation:
            await anext(generation)
        assert engine.running == 0


async def test_kv_cache_usage_counts_blocks_held_by_running_sequences() -> None:
    """Usage is the blocks held by running sequences over kv_cache_blocks, 0 once they leave."""
    settings = {"chars_per_token": 1, "block_size_tokens": 16, "kv_cache_blocks": 10}
    async with running_engine(step_s=0.01, **settings) as engine:
        generation = engine.submit("p" * 32, max_tokens=1000)
        await anext(generation)
        # the next step is already running: it holds blocks for the prompt and every
        # token generated so far (the last one's KV is what it computes)
        held = math.ceil((32 + generation.completion_tokens) / 16)
        assert engine.stats().kv_cache_usage == pytest.approx(held / 10)
        generation.cancel()
        assert engine.stats().kv_cache_usage == 0.0


async def test_preempted_generations_still_stream_exactly_their_tokens() -> None:
    """Out of KV, the engine preempts the newest request; its client sees no gap in the
    stream, only a later finish, and the preemption is counted."""
    settings = {"chars_per_token": 1, "block_size_tokens": 4, "kv_cache_blocks": 8}
    async with running_engine(**settings) as engine:
        old = engine.submit("o" * 12, max_tokens=16)
        new = engine.submit("n" * 12, max_tokens=8)
        tokens = await asyncio.gather(drain(old), drain(new))
        assert [len(t) for t in tokens] == [16, 8]
        assert (old.preemptions, new.preemptions) == (0, 1)
        assert new.finished_at is not None and old.finished_at is not None
        assert new.finished_at > old.finished_at
        assert engine.stats().preemptions == 1
        assert engine.stats().kv_cache_usage == 0.0


async def test_a_prompt_larger_than_the_kv_cache_is_refused_at_submit() -> None:
    """submit() raises PromptTooLong at once instead of queueing a request that can't run."""
    async with running_engine(chars_per_token=1, block_size_tokens=4, kv_cache_blocks=2) as engine:
        with pytest.raises(PromptTooLong):
            engine.submit("x" * 9)
        assert (engine.running, engine.waiting) == (0, 0)


async def test_stop_ends_unfinished_generations_with_engine_stopped() -> None:
    """Consumers never hang on a stopped engine."""
    engine = SimEngine(SimConfig(**FAST))
    running = engine.submit("a", max_tokens=1000)
    await anext(running)
    waiting = engine.submit("b", max_tokens=1000)
    await engine.stop()
    assert not engine.is_running
    for generation in (running, waiting):
        with pytest.raises(EngineStopped):
            await drain(generation)
        assert generation.state == "aborted"


async def test_engine_starts_on_first_submit_and_sleeps_when_idle() -> None:
    """No explicit start is needed, and an idle engine runs no steps until the next submit."""
    engine = SimEngine(SimConfig(**FAST))
    try:
        assert not engine.is_running
        await drain(engine.submit("a", max_tokens=2))
        assert engine.is_running
        steps = engine.stats().steps
        await asyncio.sleep(0.05)
        assert engine.stats().steps == steps
        await drain(engine.submit("b", max_tokens=2))
        assert engine.stats().steps == steps + 2
    finally:
        await engine.stop()


async def test_reset_zeroes_counters_and_empties_the_prefix_cache() -> None:
    """After reset() a repeated prompt misses again and counters start from zero."""
    async with running_engine(chars_per_token=1) as engine:
        await drain(engine.submit("x" * 64, max_tokens=1))
        engine.reset()
        assert engine.stats().requests_finished == 0
        again = engine.submit("x" * 64, max_tokens=1)
        await drain(again)
        assert again.cached_prompt_tokens == 0
