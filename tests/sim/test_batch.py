"""Batch, the engine's step model on a fake clock: timing, KV admission, preemption, chunks."""

from __future__ import annotations

import ast
import importlib
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.batch import Batch, StepResult
from gateway.sim.config import SimConfig
from gateway.sim.kvcache import PromptTooLong
from gateway.sim.records import Sequence
from gateway.sim.tokens import tokenize

# One character per token and 4-token blocks, so prompt lengths and block counts can be
# read off the test; a step costs 10 ms, 1 ms per sequence and 0.1 ms per prefill token.
SMALL: dict[str, Any] = {
    "chars_per_token": 1,
    "block_size_tokens": 4,
    "step_s": 0.01,
    "step_s_per_seq": 0.001,
    "prefill_s_per_token": 0.0001,
}


class Driver:
    """Steps a Batch on a fake clock, as a discrete-event simulation would."""

    def __init__(self, config: SimConfig) -> None:
        self.batch = Batch(config)
        self.now = 0.0

    @classmethod
    def small(cls, **settings: Any) -> Driver:
        return cls(SimConfig(**{**SMALL, **settings}))

    def add(self, text: str, max_tokens: int) -> Sequence:
        config = self.batch.config
        prompt = tokenize(
            text,
            chars_per_token=config.chars_per_token,
            block_size_tokens=config.block_size_tokens,
        )
        return self.batch.add(prompt, max_tokens, self.now)

    def step(self) -> StepResult:
        plan = self.batch.begin_step(self.now)
        self.now += plan.duration_s
        return self.batch.end_step(self.now)

    def steps(self, count: int) -> list[StepResult]:
        return [self.step() for _ in range(count)]


def ids(sequences: tuple[Sequence, ...]) -> list[int]:
    return [s.seq_id for s in sequences]


# The step model and what it imports: one model for the real clock and a virtual one.
STEP_MODEL = ("batch", "kvcache", "records", "prefixcache", "tokens", "config")


def test_the_step_model_reads_no_clock_and_needs_no_event_loop() -> None:
    """A virtual-clock simulation can run the very model SimEngine runs: no asyncio, no
    time source, no I/O, and nothing of gateway.sim beyond the step model itself."""
    allowed = {f"gateway.sim.{name}" for name in STEP_MODEL} | {"gateway.errors"}
    offenders = []
    for name in STEP_MODEL:
        module = importlib.import_module(f"gateway.sim.{name}")
        tree = ast.parse(Path(str(module.__file__)).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for imported in names:
                top = imported.split(".")[0]
                inside = imported in allowed or imported.startswith("gateway.core.")
                if top in {"asyncio", "time", "socket", "random"} or (
                    top == "gateway" and not inside
                ):
                    offenders.append(f"{name}: {imported}")
    assert offenders == []


def test_defaults_keep_the_documented_timing_when_kv_is_ample() -> None:
    """With the default KV cache, a lone 1,000-token prompt times as docs/sim.md says."""
    driver = Driver(SimConfig())
    cold = driver.add("x" * 4000, max_tokens=16)
    results = driver.steps(16)
    assert [r.plan.duration_s for r in results] == pytest.approx([0.2102] + [0.0102] * 15)
    assert cold.first_token_at == pytest.approx(0.2102)
    assert cold.state == "finished"
    assert results[-1].finished == (cold,)
    warm = driver.add("x" * 4000, max_tokens=1)
    assert driver.step().plan.duration_s == pytest.approx(0.0118)
    assert warm.cached_prompt_tokens == 992
    assert driver.batch.counters.preemptions == 0


def test_with_ample_kv_only_max_num_seqs_bounds_the_batch() -> None:
    """Requests are admitted in order up to max_num_seqs; each running one gains a token
    per step, and a full batch of 32 decodes in 16.4 ms steps."""
    driver = Driver(SimConfig(prefill_s_per_token=0.0))
    sequences = [driver.add(f"request {i}", max_tokens=3) for i in range(40)]
    first = driver.step()
    assert ids(first.plan.admitted) == list(range(32))
    assert len(driver.batch.waiting) == 8
    assert first.plan.duration_s == pytest.approx(0.0164)
    assert [s.generated for s in sequences] == [1] * 32 + [0] * 8
    driver.steps(2)
    assert all(s.state == "finished" for s in sequences[:32])
    driver.steps(3)
    assert all(s.state == "finished" for s in sequences)
    assert driver.batch.counters.preemptions == 0


def test_a_request_whose_prompt_blocks_are_not_free_waits_and_blocks_those_behind_it() -> None:
    """Admission needs the prompt's KV blocks; the head of the queue waits for them, and
    a smaller request behind it waits too (first come, first served)."""
    driver = Driver.small(kv_cache_blocks=10)
    running = driver.add("a" * 24, max_tokens=4)  # 6 blocks
    driver.step()
    big = driver.add("b" * 20, max_tokens=1)  # 5 blocks, 4 free (running holds 6)
    small = driver.add("c" * 4, max_tokens=1)  # 1 block: would fit, but is behind
    plan = driver.step().plan
    assert plan.admitted == ()
    assert ids(driver.batch.waiting) == [big.seq_id, small.seq_id]
    assert driver.batch.kv_blocks_used == 7  # the running one grew into its 7th block
    driver.steps(2)
    assert running.state == "finished"
    assert ids(driver.step().plan.admitted) == [big.seq_id, small.seq_id]


def test_when_a_step_runs_out_of_blocks_the_newest_sequence_is_preempted() -> None:
    """Growing sequences that find no free block push out the newest running one: it
    goes back to the front of the queue, its blocks are freed, and it is counted."""
    driver = Driver.small(kv_cache_blocks=8)
    old = driver.add("o" * 12, max_tokens=100)  # 3 blocks
    new = driver.add("n" * 12, max_tokens=100)  # 3 blocks
    late = driver.add("l" * 12, max_tokens=100)  # waits: 2 blocks free
    first = driver.step()
    assert first.plan.admitted == (old, new)
    # Both grow into their 4th block at 13 tokens; the 5th needs 17: 10 blocks > 8.
    results = driver.steps(5)
    assert [r.plan.preempted for r in results] == [()] * 4 + [(new,)]
    assert (new.state, new.preemptions, new.computed) == ("waiting", 1, 0)
    assert ids(driver.batch.waiting) == [new.seq_id, late.seq_id]
    assert driver.batch.running == (old,)
    assert driver.batch.kv_blocks_used == 5
    assert driver.batch.counters.preemptions == 1
    assert results[-1].emitted == (old,)


def test_several_preemptions_in_one_step_queue_the_victims_in_admission_order() -> None:
    """When one victim is not enough, the next newest goes too, and the queue keeps the
    order in which they had been admitted."""
    driver = Driver.small(kv_cache_blocks=8)
    sequences = [driver.add(f"s{i}xx", max_tokens=100) for i in range(4)]  # 1 block each
    driver.steps(5)  # all hold 2 blocks (8 in use); the next step needs a 3rd each
    result = driver.step()
    assert ids(result.plan.preempted) == [3, 2]
    assert ids(driver.batch.waiting) == [2, 3]
    assert driver.batch.running == tuple(sequences[:2])
    assert result.plan.admitted == ()  # no admission in a step that had to preempt


def test_a_preempted_sequence_keeps_its_tokens_and_recomputes_them_with_its_prompt() -> None:
    """Re-admitted, a preempted sequence prefills prompt + output so far (its blocks left
    the prefix cache with its KV), then continues where it stopped, to exactly max_tokens."""
    driver = Driver.small(kv_cache_blocks=8)
    old = driver.add("o" * 12, max_tokens=16)
    new = driver.add("n" * 12, max_tokens=8)
    driver.steps(6)  # the 6th step preempts `new`, which has 5 tokens
    assert (new.state, new.generated) == ("waiting", 5)
    while old.state != "finished":
        driver.step()
    result = driver.step()
    assert result.plan.admitted == (new,)
    assert result.plan.prefill_tokens == 12 + 5
    assert result.plan.duration_s == pytest.approx(0.01 + 0.001 + 0.0001 * 17)
    assert result.emitted == (new,)
    assert new.generated == 6
    assert new.cached_prompt_tokens == 0  # what the first admission found, kept
    while new.state != "finished":
        driver.step()
    assert new.generated == 8
    assert driver.batch.counters.prefix_cache_query_tokens == 12 + 12 + 17


def test_kv_usage_is_the_blocks_held_over_kv_cache_blocks() -> None:
    """vllm:kv_cache_usage_perc is real: prompt plus output blocks of running sequences."""
    driver = Driver.small(kv_cache_blocks=10)
    sequence = driver.add("p" * 8, max_tokens=6)
    driver.step()  # 8 prompt tokens: 2 blocks
    assert driver.batch.kv_cache_usage == pytest.approx(0.2)
    driver.step()  # computes the 9th token (the first output): 3 blocks
    assert driver.batch.kv_cache_usage == pytest.approx(0.3)
    driver.steps(4)
    assert sequence.state == "finished"
    assert driver.batch.kv_cache_usage == 0.0


def test_a_prefix_held_by_a_running_sequence_is_shared_not_allocated_again() -> None:
    """Prompts sharing cached prefix blocks with a running sequence hold them once, so
    they are admitted where a copy of the prefix would not fit."""
    driver = Driver.small(kv_cache_blocks=10)
    system = "s" * 24  # 6 full blocks
    first = driver.add(system + "one", max_tokens=50)  # 7 blocks
    driver.step()
    second = driver.add(system + "two", max_tokens=50)  # 1 new block beside the shared 6
    plan = driver.step().plan
    assert plan.admitted == (second,)
    assert second.cached_prompt_tokens == 24
    assert driver.batch.kv_blocks_used == 8
    assert first.state == second.state == "running"


def test_shared_blocks_are_not_shared_when_prefix_caching_is_off() -> None:
    """Without a prefix cache there is nothing to share: each prompt needs all its blocks."""
    driver = Driver.small(kv_cache_blocks=10, prefix_cache_blocks=0)
    driver.add("s" * 24 + "one", max_tokens=50)
    driver.step()
    second = driver.add("s" * 24 + "two", max_tokens=50)
    assert driver.step().plan.admitted == ()
    assert second.state == "waiting"


def test_chunked_prefill_spreads_a_long_prompt_over_steps_within_the_token_budget() -> None:
    """With max_num_batched_tokens, decodes take one token each and a prompt is prefilled
    from what is left, over several steps; each step is charged its own prefill tokens."""
    driver = Driver.small(max_num_seqs=4, max_num_batched_tokens=16)
    decoding = driver.add("d" * 4, max_tokens=100)
    driver.step()
    long = driver.add("L" * 40, max_tokens=2)
    results = driver.steps(3)
    assert [r.plan.prefill_tokens for r in results] == [15, 15, 10]
    assert [r.plan.duration_s for r in results] == pytest.approx(
        [0.01 + 0.002 + 0.0001 * n for n in (15, 15, 10)]
    )
    assert [r.emitted for r in results] == [(decoding,), (decoding,), (decoding, long)]
    assert long.first_token_at == pytest.approx(driver.now)
    assert driver.batch.kv_blocks_used == 10 + 2  # 40 prompt tokens, and the decoder's 2


def test_without_a_token_budget_a_prompt_is_prefilled_in_one_step() -> None:
    """Chunked prefill is off by default: the admitting step computes the whole prompt."""
    driver = Driver.small()
    long = driver.add("L" * 400, max_tokens=1)
    assert driver.step().plan.prefill_tokens == 400
    assert long.state == "finished"


def test_a_prompt_larger_than_the_kv_cache_is_refused_naming_the_setting() -> None:
    """A prompt that could never be admitted is refused at once, not left to wait."""
    driver = Driver.small(kv_cache_blocks=4)
    with pytest.raises(PromptTooLong, match=r"16 tokens .*kv_cache_blocks=4.*--kv-cache-blocks"):
        driver.add("x" * 17, max_tokens=1)
    assert driver.batch.idle


def test_max_tokens_is_capped_so_a_sequence_alone_fits_the_kv_cache() -> None:
    """A sequence stops when prompt and output fill the cache, as at a context limit."""
    driver = Driver.small(kv_cache_blocks=4)
    sequence = driver.add("x" * 10, max_tokens=1_000_000)
    assert sequence.max_tokens == 16 - 10 + 1
    while sequence.state != "finished":
        driver.step()
    assert sequence.generated == 7
    assert driver.batch.counters.preemptions == 0


def test_a_sequence_withdrawn_during_a_step_frees_its_blocks_and_gets_no_token() -> None:
    """Withdrawal takes effect at once, even between the halves of a step."""
    driver = Driver.small(kv_cache_blocks=10)
    sequence = driver.add("x" * 8, max_tokens=5)
    driver.batch.begin_step(driver.now)
    assert driver.batch.withdraw(sequence.seq_id) is sequence
    assert driver.batch.end_step(driver.now + 1).emitted == ()
    assert (sequence.state, sequence.generated, driver.batch.kv_blocks_used) == ("withdrawn", 0, 0)
    assert driver.batch.withdraw(sequence.seq_id) is None


def test_the_same_calls_give_the_same_steps() -> None:
    """The model reads no clock and no randomness: a virtual-clock simulation replays."""

    def trace() -> list[tuple[float, list[int], list[int]]]:
        driver = Driver.small(kv_cache_blocks=12, max_num_batched_tokens=32)
        for i in range(6):
            driver.add(f"q{i}" * (i + 2), max_tokens=10 + i)
        out = []
        while not driver.batch.idle:
            result = driver.step()
            out.append((driver.now, ids(result.emitted), ids(result.plan.preempted)))
        return out

    first = trace()
    assert any(preempted for _, _, preempted in first)
    assert first == trace()
    assert math.isfinite(first[-1][0])


@settings(max_examples=100, deadline=None)
@given(
    kv_cache_blocks=st.integers(4, 40),
    max_num_seqs=st.integers(1, 6),
    budget=st.one_of(st.none(), st.integers(0, 20)),
    prefix_cache_blocks=st.sampled_from([0, 8, 64]),
    requests=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 60), st.integers(0, 4)),
        min_size=1,
        max_size=12,
    ),
)
def test_every_request_finishes_with_its_tokens_and_kv_never_overflows(
    kv_cache_blocks: int,
    max_num_seqs: int,
    budget: int | None,
    prefix_cache_blocks: int,
    requests: list[tuple[int, int, int, int]],
) -> None:
    """Whatever the load, KV pressure delays requests but never loses, starves or
    overfills: each one ends with exactly its (capped) max_tokens."""
    driver = Driver.small(
        kv_cache_blocks=kv_cache_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=None if budget is None else max_num_seqs + budget,
        prefix_cache_blocks=prefix_cache_blocks,
    )
    capacity = driver.batch.capacity_tokens
    # (shared prefix, prompt length, max_tokens, steps after the previous arrival)
    arrivals: list[tuple[int, str, int]] = []
    at = 0
    for prefix, length, max_tokens, gap in requests:
        at += gap
        text = (f"shared{prefix}" * 8 + "x" * length)[: min(length + 8, capacity)]
        arrivals.append((at, text, max_tokens))
    added: list[Sequence] = []
    for index in range(20_000):
        added += [driver.add(text, n) for at, text, n in arrivals if at == index]
        if driver.batch.idle and len(added) == len(arrivals):
            break
        plan = driver.batch.begin_step(driver.now)
        assert driver.batch.kv_blocks_used <= kv_cache_blocks
        assert len(driver.batch.running) <= max_num_seqs
        driver.now += plan.duration_s
        driver.batch.end_step(driver.now)
    assert driver.batch.idle and len(added) == len(arrivals)
    assert all(s.state == "finished" and s.generated == s.max_tokens for s in added)
    assert driver.batch.kv_blocks_used == 0
