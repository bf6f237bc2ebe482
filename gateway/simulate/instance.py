"""Instance: one simulated inference server, the step model of `gateway.sim.batch` on a
virtual clock.

The real-time simulator (`gateway.sim.engine.SimEngine`) drives the same `Batch` on the
event loop's real time and hands every token to an HTTP response; here nobody reads
tokens, so a request is told only when it finishes, with the `Sequence` that recorded
its admission, first token and end. The steps, their durations, preemptions and prefix
hits are the `Batch`'s in both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.asgi.timing import GAP_GROWTH
from gateway.routing.readings import Reading
from gateway.sim.batch import Batch
from gateway.sim.config import SimConfig
from gateway.sim.records import Sequence
from gateway.sim.tokens import TokenizedPrompt

MAX_INSTANCES = 10_000
"""The most instances a simulation runs (``--num-instances``, or a sweep's value): far
beyond one pool's fleet; each instance's state is built before the run."""


class Instance:
    """A simulated server at ``url``: continuous batching on the running loop's clock.

    ``first_token`` is called with a sequence the moment it produces its first token, and
    ``longer_gap`` the moment a token of it ends a wait a server would tell (capacity
    providers that follow the backends' latency are fed from them). Use from one event
    loop only.
    """

    def __init__(
        self,
        url: str,
        config: SimConfig,
        *,
        first_token: Callable[[Sequence], None] | None = None,
        longer_gap: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.url = url
        self.batch = Batch(config)
        self._first_token = first_token
        self._longer_gap = longer_gap
        #: per running sequence, the last wait between two of its tokens told to
        #: ``longer_gap``, by the rule a server tells them (``gateway.asgi.timing``)
        self._told: dict[int, float] = {}
        self._done: dict[int, asyncio.Future[Sequence]] = {}
        self._stepping = False
        #: requests this instance took (not those it refused: ``PromptTooLong``)
        self.requests = 0

    def submit(self, prompt: TokenizedPrompt, max_tokens: int) -> asyncio.Future[Sequence]:
        """Queue a request; the future resolves with its `Sequence` when it finishes.

        Raises `gateway.sim.kvcache.PromptTooLong` for a prompt larger than the KV cache.
        """
        loop = asyncio.get_running_loop()
        sequence = self.batch.add(prompt, max_tokens, loop.time())
        done: asyncio.Future[Sequence] = loop.create_future()
        self._done[sequence.seq_id] = done
        self.requests += 1
        if not self._stepping:
            # soon, not now: requests arriving at the same instant join the same step
            self._stepping = True
            loop.call_soon(self._begin)
        return done

    def reading(self, now: float) -> Reading:
        """What a scrape of this instance's metrics would show at ``now``."""
        batch = self.batch
        return Reading(
            self.url,
            healthy=True,
            running=float(len(batch.running)),
            waiting=float(len(batch.waiting)),
            kv_usage=batch.kv_cache_usage,
            preemptions=float(batch.counters.preemptions),
            at=now,
            engine="vllm",
        )

    def _begin(self) -> None:
        batch = self.batch
        if batch.idle:
            self._stepping = False
            return
        loop = asyncio.get_running_loop()
        plan = batch.begin_step(loop.time())
        loop.call_at(plan.started_at + plan.duration_s, self._end)

    def _end(self) -> None:
        loop = asyncio.get_running_loop()
        result = self.batch.end_step(loop.time())
        first_token, longer_gap = self._first_token, self._longer_gap
        if first_token is not None or longer_gap is not None:
            for sequence in result.emitted:
                if sequence.generated == 1:
                    if first_token is not None:
                        first_token(sequence)
                elif longer_gap is not None:
                    told = self._told.get(sequence.seq_id, -1.0)
                    if sequence.last_gap_s > GAP_GROWTH * told:
                        self._told[sequence.seq_id] = sequence.last_gap_s
                        longer_gap(sequence)
        for sequence in result.finished:
            self._told.pop(sequence.seq_id, None)
            self._done.pop(sequence.seq_id).set_result(sequence)
        self._begin()
