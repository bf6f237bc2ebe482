"""This pod's running estimate of Redis' clock, to judge whether a grant can be trusted.

A grant carries its lease's expiry on Redis' clock (``TIME``). A pod that reads it late
(it was frozen by ``SIGSTOP``, a long pause, an event loop held up) may be running it on a
lease Redis has already reaped and given to another pod. Pod clocks are never compared
with Redis' directly: the estimate is the pod's own monotonic clock plus the offset seen
in its latest reply, taken from the moment the call was *sent*, so it never runs behind
Redis' clock (it runs ahead by at most the call's round trip), and a late grant is never
mistaken for a fresh one.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RedisClock:
    """An upper bound of Redis' clock, in ms, from the replies this pod got."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._offset_ms: float | None = None
        self._low_offset_ms: float | None = None

    def sent(self) -> float:
        """The local time to pass to ``observe`` with the reply of a call sent now."""
        return self._monotonic()

    def observe(self, redis_ms: int, sent_at: float) -> None:
        """Redis answered ``redis_ms`` to a call sent at ``sent_at`` (from ``sent``)."""
        self._offset_ms = redis_ms - sent_at * 1000
        self._low_offset_ms = redis_ms - self._monotonic() * 1000

    def deadline_ms(self, within_s: float) -> int:
        """A deadline on Redis' clock that a call sent now meets only if Redis runs it
        within ``within_s`` of now (it may be a little early, never late); 0 before the
        first reply (no deadline)."""
        if self._low_offset_ms is None:
            return 0
        return int(self._monotonic() * 1000 + self._low_offset_ms + within_s * 1000)

    def upper_ms(self) -> float | None:
        """Redis' clock now, or a little ahead of it; None before the first reply."""
        if self._offset_ms is None:
            return None
        return self._monotonic() * 1000 + self._offset_ms

    def outlives(self, expires_ms: int, margin_ms: float) -> bool:
        """Whether a lease expiring at ``expires_ms`` certainly lasts ``margin_ms`` more.

        Before any reply nothing can be judged, and the answer is False.
        """
        upper = self.upper_ms()
        return upper is not None and expires_ms - upper >= margin_ms
