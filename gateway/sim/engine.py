"""SimEngine: the step model of `gateway.sim.batch` driven on the event loop's real clock."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gateway.sim.batch import Batch
from gateway.sim.config import SimConfig
from gateway.sim.generation import EngineStopped, Generation
from gateway.sim.tokens import TokenizedPrompt, filler_token, tokenize

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's gauges, and its counters since construction or reset."""

    running: int
    """Sequences in the batch."""
    waiting: int
    """Requests waiting for admission (a batch slot, KV blocks), preempted ones included."""
    kv_cache_usage: float
    """Fraction 0..1 of `kv_cache_blocks` held by running sequences (a shared prefix
    block counts once)."""
    prefix_cache_query_tokens: int
    """Prompt tokens of admitted requests (vLLM's prefix-cache queries)."""
    prefix_cache_hit_tokens: int
    """Of those, the tokens found in the prefix cache."""
    requests_finished: int
    """Generations that produced all their tokens."""
    requests_cancelled: int
    """Generations withdrawn by their consumer before finishing."""
    steps: int
    """Engine steps run."""
    preemptions: int = 0
    """Times a running sequence was sent back to the waiting queue to free KV blocks."""


class SimEngine:
    """A simulated inference engine: continuous batching on the event loop's clock.

    What a step does and how long it takes is the `Batch`'s decision (see
    `gateway.sim.batch` and docs/sim.md: FIFO admission bounded by `max_num_seqs` and KV
    blocks, preemption of the newest sequence when KV runs out, optional chunked
    prefill). The engine begins a step, sleeps for its duration, ends it and hands each
    produced token to its `Generation`. With nothing waiting or running the loop sleeps
    until the next `submit()`.

    The loop is an asyncio task on the loop that first calls `start()` or `submit()`;
    one engine serves one event loop. Not thread-safe: call it from that loop only.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self._config = config if config is not None else SimConfig()
        self._batch = Batch(self._config)
        self._generations: dict[int, Generation] = {}
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None

    @property
    def config(self) -> SimConfig:
        """The configuration this engine simulates."""
        return self._config

    @property
    def is_running(self) -> bool:
        """True while the engine loop task is alive."""
        return self._task is not None and not self._task.done()

    @property
    def running(self) -> int:
        """Sequences in the batch now."""
        return len(self._batch.running)

    @property
    def waiting(self) -> int:
        """Requests waiting for admission now, preempted ones included."""
        return len(self._batch.waiting)

    async def start(self) -> None:
        """Start the engine loop on the running event loop; no effect if already running."""
        self._ensure_started()

    async def stop(self) -> None:
        """Stop the engine loop and end every unfinished generation with `EngineStopped`.

        Idempotent. A later `start()` or `submit()` starts a fresh loop (the prefix cache
        and counters are kept).
        """
        task = self._task
        if task is None:
            return
        task.cancel()
        # wait() rather than `await task`: it neither raises the task's CancelledError
        # nor swallows a cancellation of stop() itself.
        await asyncio.wait([task])
        if self._task is task:
            self._task = None

    def tokenize(self, text: str) -> TokenizedPrompt:
        """Tokenize `text` with this engine's `chars_per_token` and `block_size_tokens`."""
        return tokenize(
            text,
            chars_per_token=self._config.chars_per_token,
            block_size_tokens=self._config.block_size_tokens,
        )

    def submit(self, prompt: TokenizedPrompt | str, max_tokens: int | None = None) -> Generation:
        """Queue a request and return its `Generation`; starts the loop if needed.

        `max_tokens` defaults to the config's `default_max_tokens`; it must be >= 1, and
        is capped so that prompt and output fit in the KV cache. Raises
        `gateway.sim.kvcache.PromptTooLong` when the prompt alone is larger than the KV
        cache. Must be called from inside the event loop the engine runs on.
        """
        if max_tokens is None:
            max_tokens = self._config.default_max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if isinstance(prompt, str):
            prompt = self.tokenize(prompt)
        wakeup = self._ensure_started()
        now = asyncio.get_running_loop().time()
        sequence = self._batch.add(prompt, max_tokens, now)
        generation = Generation(sequence.seq_id, prompt, sequence.max_tokens, now, self._withdraw)
        self._generations[sequence.seq_id] = generation
        wakeup.set()
        return generation

    def stats(self) -> EngineStats:
        """Current gauges and the counters accumulated since construction or `reset()`."""
        counters = self._batch.counters
        return EngineStats(
            running=len(self._batch.running),
            waiting=len(self._batch.waiting),
            kv_cache_usage=self._batch.kv_cache_usage,
            prefix_cache_query_tokens=counters.prefix_cache_query_tokens,
            prefix_cache_hit_tokens=counters.prefix_cache_hit_tokens,
            requests_finished=counters.finished,
            requests_cancelled=counters.withdrawn,
            steps=counters.steps,
            preemptions=counters.preemptions,
        )

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache; requests in flight are unaffected."""
        self._batch.reset()

    def _ensure_started(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        task = self._task
        if task is not None and not task.done() and self._wakeup is not None:
            if task.get_loop() is loop:
                return self._wakeup
            if not task.get_loop().is_closed():
                raise RuntimeError(
                    "this SimEngine already runs on another event loop; "
                    "create one engine per event loop (one per server)"
                )
            # Its loop was closed under it: those requests can never finish.
            self._batch.abort_all()
            self._generations.clear()
        wakeup = asyncio.Event()
        self._wakeup = wakeup
        self._task = loop.create_task(self._run(wakeup), name="obleth-sim-engine")
        self._task.add_done_callback(_log_crash)
        return wakeup

    async def _run(self, wakeup: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        batch = self._batch
        step_s = self._config.step_s
        due: float | None = None  # when the step just taken was due to end
        try:
            while True:
                if batch.idle:
                    wakeup.clear()
                    await wakeup.wait()
                    due = None
                    continue
                now = loop.time()
                # A step starts when the previous one was due to end, not when the timer
                # woke up late for it (a lag of up to one step is made up), so neither the
                # loop's overhead nor timer lateness adds up over a stream.
                started = now if due is None else max(min(now, due), now - step_s)
                plan = batch.begin_step(started)
                for sequence in plan.preempted:
                    self._generations[sequence.seq_id].mark_preempted()
                for sequence in plan.admitted:
                    generation = self._generations[sequence.seq_id]
                    generation.mark_admitted(started, sequence.cached_prompt_tokens)
                due = started + plan.duration_s
                await asyncio.sleep(max(0.0, due - loop.time()))
                self._deliver(loop.time())
        finally:
            self._abort_all(loop.time())

    def _deliver(self, now: float) -> None:
        """End the step in flight and hand its tokens to their generations."""
        result = self._batch.end_step(now)
        chars_per_token = self._config.chars_per_token
        for sequence in result.emitted:
            generation = self._generations[sequence.seq_id]
            token = filler_token(generation.completion_tokens, chars_per_token=chars_per_token)
            generation.emit(token, now)
        for sequence in result.finished:
            self._generations.pop(sequence.seq_id).end("finished", now)

    def _withdraw(self, generation: Generation) -> None:
        if self._batch.withdraw(generation.seq_id) is None:
            return
        del self._generations[generation.seq_id]
        generation.end("cancelled", _loop_time_or(generation.submitted_at))

    def _abort_all(self, now: float) -> None:
        self._batch.abort_all()
        pending = list(self._generations.values())
        self._generations.clear()
        for generation in pending:
            error = EngineStopped("the simulated engine stopped before this request finished")
            generation.end("aborted", now, error)


def _loop_time_or(default: float) -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return default


def _log_crash(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        logger.error("the simulated engine loop crashed", exc_info=error)
