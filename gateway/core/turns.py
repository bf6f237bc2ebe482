"""``Turns``: whose turn it is among tenants that tie in the fair queue.

Each tenant's turn is the count of its last grant, or of its first request when it has had
none; the oldest turn goes first. A tenant keeps its turn while idle (its only request
timed out, say, and it sends another), for the last ``IDLE_TURNS`` tenants to go idle, so
memory stays bounded however many tenants a service has seen. ``step.lua`` keeps the same
in Redis, with the same bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container

#: How many idle tenants keep their turn (step.lua's ``IDLE_TURNS`` is the same); one
#: that went idle longer ago gets a new turn, behind every other, when it comes back.
IDLE_TURNS = 10_000


class Turns:
    """The turns of the tenants that hold seats, wait, or went idle lately.

    ``of`` maps a tenant to its turn (read it, do not write it); ``take`` gives a tenant
    the newest turn (the request path may write it out: ``count += 1``, then
    ``of[tenant] = count``); ``went_idle`` is told when a tenant holds and waits for
    nothing. ``active`` are the tables of the tenants that hold or wait (the fair queue's
    own): a tenant in one of them is never forgotten.
    """

    __slots__ = ("_active", "_idle", "count", "of")

    def __init__(self, *active: Container[str]) -> None:
        self.of: dict[str, int] = {}
        self.count = 0
        self._active = active
        #: tenants by when they last went idle (some may be active again since)
        self._idle: OrderedDict[str, None] = OrderedDict()

    def take(self, tenant: str) -> None:
        """``tenant`` goes behind every other tenant that ties with it."""
        self.count += 1
        self.of[tenant] = self.count

    def went_idle(self, tenant: str) -> None:
        """``tenant`` holds and waits for nothing now: it keeps its turn, unless more than
        ``IDLE_TURNS`` tenants went idle since (and it is not active again)."""
        idle = self._idle
        idle[tenant] = None
        idle.move_to_end(tenant)
        if len(idle) > IDLE_TURNS:
            # an OrderedDict: a plain dict's first key is found past every deleted slot
            oldest, _ = idle.popitem(last=False)
            if not any(oldest in table for table in self._active):
                del self.of[oldest]

    @property
    def idle(self) -> int:
        """How many tenants are remembered as idle (for tests of the bound)."""
        return len(self._idle)
