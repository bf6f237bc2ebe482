"""``Complaints``: log lines about faults that repeat on every request, at most one a
minute per source.

A plugin that raises, a capacity provider that answers nonsense, a gateway that cannot
start: each fault would otherwise write a line (and a traceback) per request, and the
log would drown what else it says. The first occurrence is logged at once, then one a
minute per source while it lasts.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

#: How long a source stays quiet after a complaint about it was logged.
QUIET_S = 60.0


class Complaints:
    """Decides whether a complaint may be logged now; the caller writes the log line, so
    that it keeps its own logger, level and traceback.

    Sources are whatever the caller names them by (a plugin's name, a provider's index);
    there are as many as there are plugins and providers, so nothing is forgotten.
    """

    __slots__ = ("_last", "_quiet_s")

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self._quiet_s = quiet_s
        self._last: dict[Hashable, float] = {}

    def may(self, source: Hashable = None) -> bool:
        """True when nothing was logged about ``source`` in the last ``quiet_s`` (and counts
        this one as logged); False otherwise."""
        now = time.monotonic()
        last = self._last.get(source)
        if last is not None and now - last < self._quiet_s:
            return False
        self._last[source] = now
        return True
