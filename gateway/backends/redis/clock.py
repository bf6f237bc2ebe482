"""This pod's running estimate of Redis' clock: bounds on it, from the pod's own replies.

Pod clocks are never compared with Redis' directly. Each reply carries Redis' ``TIME``
when the call ran, and the pod knows, on its own monotonic clock, when it sent the call
and when it read the reply; Redis' clock then was at most (its reading + the time since
sending) and at least (its reading + the time since reading). Two uses:

- **Trusting a grant.** A grant carries its lease's expiry on Redis' clock. A pod that
  reads it late (frozen by ``SIGSTOP``, a long pause, a held-up event loop) may be
  looking at a lease Redis has already reaped and given to another pod; the *upper*
  bound says whether the lease certainly still holds.
- **A deadline for a call.** A call Redis runs after its pod gave up waiting must change
  nothing; the *lower* bound gives a deadline the call meets only while the pod still
  waits.

Every reply gives valid bounds, but one read late (the pod was frozen between Redis
answering and the pod reading) gives a loose one; the tightest of the last few replies
is used, so one late reading never sticks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: How many recent replies the bounds are taken from.
_RECENT = 8


class RedisClock:
    """Bounds on Redis' clock (ms) now, from the replies this pod got."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        # per reply: (Redis' reading - local time of sending, - local time of reading), ms
        self._recent: deque[tuple[float, float]] = deque(maxlen=_RECENT)
        # the tightest of them, kept up to date by observe(): read on every grant
        self._high: float | None = None
        self._low: float | None = None

    def sent(self) -> float:
        """The local time to pass to ``observe`` with the reply of a call sent now."""
        return self._monotonic()

    def observe(self, redis_ms: int, sent_at: float) -> None:
        """Redis answered ``redis_ms`` to a call sent at ``sent_at`` (from ``sent``)."""
        self._recent.append((redis_ms - sent_at * 1000, redis_ms - self._monotonic() * 1000))
        self._high = min(high for high, _ in self._recent)
        self._low = max(low for _, low in self._recent)

    def upper_ms(self) -> float | None:
        """Redis' clock now, or a little ahead of it; None before the first reply."""
        if self._high is None:
            return None
        return self._monotonic() * 1000 + self._high

    def lower_ms(self) -> float | None:
        """Redis' clock now, or a little behind it; None before the first reply."""
        if self._low is None:
            return None
        return self._monotonic() * 1000 + self._low

    def outlives(self, expires_ms: int, margin_ms: float) -> bool:
        """Whether a lease expiring at ``expires_ms`` certainly lasts ``margin_ms`` more.

        Before any reply nothing can be judged, and the answer is False.
        """
        upper = self.upper_ms()
        return upper is not None and expires_ms - upper >= margin_ms

    def deadline_ms(self, within_s: float) -> int:
        """A deadline on Redis' clock that a call sent now meets only if Redis runs it
        within ``within_s`` of now (it may come a little early, never late); 0 before
        the first reply (no deadline)."""
        lower = self.lower_ms()
        return 0 if lower is None else int(lower + within_s * 1000)
