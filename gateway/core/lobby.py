"""The lobby: requests waiting for room in a full fair queue, first come first served.

Under ``block`` (the ``"wait"`` action) a request that finds the fair queue full is never
refused for it: it waits here, outside the ``max_queue`` bound, and enters the queue as
soon as the queue has room (after a grant, a cancel, a timeout), oldest first. Once in
the queue it competes by fair share and priority like any waiter. ``FairQueue`` owns the
lobby and keeps it empty whenever the queue has room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.core.fairqueue import Waiter


class Lobby:
    """Waiters in arrival order; adding, taking out and taking the oldest cost O(1)."""

    __slots__ = ("_counts", "_waiters")

    def __init__(self) -> None:
        self._waiters: OrderedDict[Waiter, None] = OrderedDict()
        #: (tenant, rank) -> waiters here, for snapshots
        self._counts: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._waiters

    def __iter__(self) -> Iterator[Waiter]:
        """Oldest first."""
        return iter(self._waiters)

    def add(self, waiter: Waiter) -> None:
        self._waiters[waiter] = None
        key = (waiter.ticket.tenant, waiter.ticket.rank)
        self._counts[key] = self._counts.get(key, 0) + 1

    def discard(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out; False when it was not here."""
        if waiter not in self._waiters:
            return False
        del self._waiters[waiter]
        self._uncount(waiter)
        return True

    def pop_oldest(self) -> Waiter:
        """Take out the waiter that arrived first (the lobby must not be empty)."""
        waiter, _ = self._waiters.popitem(last=False)
        self._uncount(waiter)
        return waiter

    def waiting(self, tenant: str, rank: int) -> int:
        """How many of ``tenant``'s requests of class ``rank`` wait here."""
        return self._counts.get((tenant, rank), 0)

    def _uncount(self, waiter: Waiter) -> None:
        key = (waiter.ticket.tenant, waiter.ticket.rank)
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]
