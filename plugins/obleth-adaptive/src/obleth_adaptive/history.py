"""The limit's recent values: which limit was in force at a given time (the one a stalled
stream's gap began under)."""

from __future__ import annotations

from collections import deque


class LimitHistory:
    """The last ``size`` changes of a limit, each with the time it was noted (the law's
    clock; notes come in time order). Older changes are dropped."""

    def __init__(self, size: int) -> None:
        self._changes: deque[tuple[float, int]] = deque(maxlen=size)

    def note(self, now: float, value: int) -> None:
        """The limit is ``value`` at ``now``; kept only if it changed since the last note."""
        if not self._changes or self._changes[-1][1] != value:
            self._changes.append((now, value))

    def at(self, when: float) -> int | None:
        """The value in force at ``when``; None if that is older than every change kept."""
        for at, value in reversed(self._changes):
            if at <= when:
                return value
        return None
