"""SimEngine: continuous batching over a FIFO queue, one token per running sequence per step."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from gateway.sim.config import SimConfig
from gateway.sim.generation import EngineStopped, Generation
from gateway.sim.prefixcache import PrefixCache
from gateway.sim.tokens import TokenizedPrompt, filler_token, tokenize

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's gauges, and its counters since construction or reset."""

    running: int
    """Sequences in the batch."""
    waiting: int
    """Requests queued for a batch slot."""
    kv_cache_usage: float
    """Fraction 0..1 of `kv_cache_blocks` held by running sequences' prompt and output."""
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


class SimEngine:
    """A simulated inference engine doing continuous batching on a step clock.

    Each step: admit waiting requests in FIFO order while fewer than `max_num_seqs` run;
    sleep for

        step_s + step_s_per_seq * running + prefill_s_per_token * uncached_prompt_tokens

    where `running` counts the batch after admission and `uncached_prompt_tokens` sums
    the prompt tokens that missed the prefix cache over the requests admitted in this
    step; then every running sequence emits one token and those that reached their
    `max_tokens` leave the batch. With nothing waiting or running the loop sleeps until
    the next `submit()`.

    The loop is an asyncio task on the loop that first calls `start()` or `submit()`;
    one engine serves one event loop. Not thread-safe: call it from that loop only.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self._config = config if config is not None else SimConfig()
        self._prefix_cache = PrefixCache(self._config.prefix_cache_blocks)
        # Dicts keep insertion order (FIFO) and remove a withdrawn request in O(1).
        self._waiting: dict[int, Generation] = {}
        self._running: dict[int, Generation] = {}
        self._seq_ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._query_tokens = 0
        self._hit_tokens = 0
        self._finished = 0
        self._cancelled = 0
        self._steps = 0

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
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests queued for a batch slot now."""
        return len(self._waiting)

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

        `max_tokens` defaults to the config's `default_max_tokens`; it must be >= 1.
        Must be called from inside the event loop the engine runs on.
        """
        if max_tokens is None:
            max_tokens = self._config.default_max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if isinstance(prompt, str):
            prompt = self.tokenize(prompt)
        wakeup = self._ensure_started()
        seq_id = next(self._seq_ids)
        now = asyncio.get_running_loop().time()
        generation = Generation(seq_id, prompt, max_tokens, now, self._withdraw)
        self._waiting[seq_id] = generation
        wakeup.set()
        return generation

    def stats(self) -> EngineStats:
        """Current gauges and the counters accumulated since construction or `reset()`."""
        block = self._config.block_size_tokens
        held_blocks = sum(
            -(-(g.prompt_tokens + g.completion_tokens) // block) for g in self._running.values()
        )
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_cache_usage=min(1.0, held_blocks / self._config.kv_cache_blocks),
            prefix_cache_query_tokens=self._query_tokens,
            prefix_cache_hit_tokens=self._hit_tokens,
            requests_finished=self._finished,
            requests_cancelled=self._cancelled,
            steps=self._steps,
        )

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache; requests in flight are unaffected."""
        self._query_tokens = 0
        self._hit_tokens = 0
        self._finished = 0
        self._cancelled = 0
        self._steps = 0
        self._prefix_cache.clear()

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
            self._waiting.clear()
            self._running.clear()
        wakeup = asyncio.Event()
        self._wakeup = wakeup
        self._task = loop.create_task(self._run(wakeup), name="obleth-sim-engine")
        self._task.add_done_callback(_log_crash)
        return wakeup

    async def _run(self, wakeup: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        config = self._config
        due: float | None = None  # when the step just taken was due to end
        try:
            while True:
                if not self._waiting and not self._running:
                    wakeup.clear()
                    await wakeup.wait()
                    due = None
                    continue
                now = loop.time()
                # A step starts when the previous one was due to end, not when the timer
                # woke up late for it (a lag of up to one step is made up), so neither the
                # loop's overhead nor timer lateness adds up over a stream.
                started = now if due is None else max(min(now, due), now - config.step_s)
                prefill_tokens = self._admit(started)
                step_s = (
                    config.step_s
                    + config.step_s_per_seq * len(self._running)
                    + config.prefill_s_per_token * prefill_tokens
                )
                due = started + step_s
                await asyncio.sleep(max(0.0, due - loop.time()))
                self._complete_step(loop.time())
        finally:
            self._abort_all(loop.time())

    def _admit(self, now: float) -> int:
        """Move waiting requests into the batch; return their uncached prompt tokens."""
        block = self._config.block_size_tokens
        uncached = 0
        while self._waiting and len(self._running) < self._config.max_num_seqs:
            seq_id = next(iter(self._waiting))
            generation = self._waiting.pop(seq_id)
            hit_blocks = self._prefix_cache.lookup_and_insert(generation.prompt.block_hashes)
            # The last prompt token is always computed, as in vLLM: its logits produce the
            # first output token, so a fully cached prompt still costs one token of prefill.
            cached = min(hit_blocks * block, generation.prompt_tokens - 1)
            generation.mark_admitted(now, cached)
            self._query_tokens += generation.prompt_tokens
            self._hit_tokens += cached
            uncached += generation.prompt_tokens - cached
            self._running[seq_id] = generation
        return uncached

    def _complete_step(self, now: float) -> None:
        self._steps += 1
        chars_per_token = self._config.chars_per_token
        for seq_id, generation in list(self._running.items()):
            token = filler_token(generation.completion_tokens, chars_per_token=chars_per_token)
            generation.emit(token, now)
            if generation.completion_tokens >= generation.max_tokens:
                del self._running[seq_id]
                generation.end("finished", now)
                self._finished += 1

    def _withdraw(self, generation: Generation) -> None:
        seq_id = generation.seq_id
        if self._waiting.pop(seq_id, None) is None and self._running.pop(seq_id, None) is None:
            return
        self._cancelled += 1
        generation.end("cancelled", _loop_time_or(generation.submitted_at))

    def _abort_all(self, now: float) -> None:
        pending = [*self._running.values(), *self._waiting.values()]
        self._running.clear()
        self._waiting.clear()
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
