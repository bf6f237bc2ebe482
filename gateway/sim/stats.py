"""SimStats: the simulator's ground truth (requests inside completion endpoints) and snapshots."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from gateway.sim.engine import SimEngine

Outcome = Literal["completed", "failed", "disconnected"]
"""How a completion request left: whole 200 response sent, error response sent, or the
client went away (or the handler died) before the last byte."""


@dataclass(frozen=True, slots=True)
class SimSnapshot:
    """Everything `GET /sim/stats` reports, at one instant."""

    concurrency: int
    """Requests inside a completion endpoint now."""
    max_concurrency: int
    """Highest `concurrency` since start or the last reset."""
    requests: int
    """Completion requests that arrived."""
    completed: int
    """Completion requests answered 200 down to the last byte."""
    failed: int
    """Completion requests answered with an error status (400, injected 5xx, ...)."""
    disconnected: int
    """Completion requests whose client went away before the last byte."""
    running: int
    """Engine: sequences in the batch."""
    waiting: int
    """Engine: requests waiting for admission (a batch slot, KV blocks)."""
    kv_cache_usage: float
    """Engine: fraction 0..1 of the KV cache's blocks held by running sequences."""
    prefix_cache_query_tokens: int
    """Engine: prompt tokens looked up in the prefix cache."""
    prefix_cache_hit_tokens: int
    """Engine: prompt tokens found there."""
    requests_finished: int
    """Engine: generations that produced all their tokens."""
    preemptions: int = 0
    """Engine: running sequences sent back to the waiting queue to free KV blocks. (A
    default, so that snapshots written by hand before it existed still build.)"""

    def as_dict(self) -> dict[str, int | float]:
        """The snapshot as a JSON-ready dict."""
        return asdict(self)


class SimStats:
    """Counts requests inside the completion endpoints, the simulator's ground truth.

    A request counts from the moment its endpoint is entered until the final body message
    of its response has been handed to the server, or until the endpoint notices that the
    client went away. The decrement happens in the same event-loop step as that last send,
    so no other request can be observed in between: a client that sends its next request
    after reading a whole response never sees the previous one still counted. A client
    that disconnects stays counted until the simulator notices the disconnect.

    Used from the app's event loop only.
    """

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine
        self._concurrency = 0
        self._max_concurrency = 0
        self._requests = 0
        self._outcomes: dict[Outcome, int] = {"completed": 0, "failed": 0, "disconnected": 0}

    @property
    def engine(self) -> SimEngine:
        """The engine whose gauges the snapshots include."""
        return self._engine

    @property
    def concurrency(self) -> int:
        """Requests inside a completion endpoint now."""
        return self._concurrency

    @property
    def max_concurrency(self) -> int:
        """Highest `concurrency` since start or the last `reset()`."""
        return self._max_concurrency

    def request_arrived(self) -> None:
        """A completion request entered its endpoint."""
        self._requests += 1
        self._concurrency += 1
        self._max_concurrency = max(self._max_concurrency, self._concurrency)

    def request_left(self, outcome: Outcome) -> None:
        """A request counted by `request_arrived()` left; call exactly once per arrival."""
        self._concurrency -= 1
        self._outcomes[outcome] += 1

    def snapshot(self) -> SimSnapshot:
        """The ground-truth counters together with the engine's."""
        engine = self._engine.stats()
        return SimSnapshot(
            concurrency=self._concurrency,
            max_concurrency=self._max_concurrency,
            requests=self._requests,
            completed=self._outcomes["completed"],
            failed=self._outcomes["failed"],
            disconnected=self._outcomes["disconnected"],
            running=engine.running,
            waiting=engine.waiting,
            kv_cache_usage=engine.kv_cache_usage,
            prefix_cache_query_tokens=engine.prefix_cache_query_tokens,
            prefix_cache_hit_tokens=engine.prefix_cache_hit_tokens,
            requests_finished=engine.requests_finished,
            preemptions=engine.preemptions,
        )

    def reset(self) -> None:
        """Zero the counters, empty the prefix cache, restart the peak from `concurrency`.

        Requests still in flight stay counted, so `max_concurrency` is never below
        `concurrency`.
        """
        self._max_concurrency = self._concurrency
        self._requests = 0
        self._outcomes = dict.fromkeys(self._outcomes, 0)
        self._engine.reset()
