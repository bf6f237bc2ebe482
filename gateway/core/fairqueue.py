"""The fair queue: seats in flight and waiting requests, per tenant and priority class.

Dispatch is weighted max-min fairness in seats held: among the tenants waiting in the most
urgent non-empty class, the next seat goes to the one with the smallest
``(seats in flight + head's seats) / weight``, ties to the oldest head. No banked credit
(an idle tenant cannot burst past its share later), no estimate of request duration,
FIFO within a tenant, and no skipping past the chosen head when it does not fit.

Each class keeps a heap of tenants keyed that way. A tenant's key changes whenever its
seats in flight or its head change; instead of re-sorting, a fresh entry is pushed with a
new version and older entries are skipped when they surface, so every decision costs
O(log tenants) amortized.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gateway.core.tickets import PRIORITIES, Ticket

_RANKS = range(len(PRIORITIES))


@dataclass(slots=True, eq=False)
class Waiter:
    """A queued request. ``handle`` belongs to the driver (a future, an id); core never reads it."""

    ticket: Ticket
    order: int
    since: float
    handle: object = None
    alive: bool = field(default=True)


class FairQueue:
    """Seats in flight and waiters; the state every admission decision reads.

    The caller passes the limit into each decision, so a limit that changes between calls
    is honoured at once; lowering it never takes back seats already granted.
    """

    def __init__(
        self,
        *,
        max_queue: int,
        weights: Mapping[str, float] | None = None,
        tenant_caps: Mapping[str, int] | None = None,
        default_weight: float = 1.0,
        default_cap: int | None = None,
    ) -> None:
        self.max_queue = max_queue
        self.inflight = 0
        self.queued = 0
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self._caps = dict(tenant_caps or {})
        self._default_cap = default_cap
        self._tenant_inflight: dict[str, int] = {}
        self._tenant_queued: dict[str, int] = {}
        self._rank_queued = [0 for _ in _RANKS]
        self._queues: list[dict[str, deque[Waiter]]] = [{} for _ in _RANKS]
        self._heaps: list[list[tuple[float, int, int, str]]] = [[] for _ in _RANKS]
        self._versions: list[dict[str, int]] = [{} for _ in _RANKS]
        self._next_version = 0
        self._next_order = 0

    # -- what policies and snapshots may read -------------------------------------------

    @property
    def queue_full(self) -> bool:
        return self.queued >= self.max_queue

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, self._default_weight)

    def cap(self, tenant: str) -> int | None:
        return self._caps.get(tenant, self._default_cap)

    def tenant_inflight(self, tenant: str) -> int:
        return self._tenant_inflight.get(tenant, 0)

    def tenant_queued(self, tenant: str) -> int:
        return self._tenant_queued.get(tenant, 0)

    def tenants(self) -> set[str]:
        """Tenants holding seats or waiting right now."""
        return set(self._tenant_inflight) | set(self._tenant_queued)

    def queued_by_class(self, tenant: str) -> dict[str, int]:
        return {
            PRIORITIES[rank]: sum(1 for w in self._queues[rank].get(tenant, ()) if w.alive)
            for rank in _RANKS
        }

    def waiting_at_or_above(self, rank: int) -> bool:
        """Whether anyone of class ``rank`` or more urgent is waiting (no barging past them)."""
        return any(self._rank_queued[r] for r in range(rank + 1))

    def waiters(self) -> Iterator[Waiter]:
        for rank in _RANKS:
            for queue in self._queues[rank].values():
                yield from (w for w in queue if w.alive)

    # -- mutations ------------------------------------------------------------------------

    def can_grant_now(self, ticket: Ticket, limit: int) -> bool:
        return self.inflight + ticket.seats <= limit and not self.waiting_at_or_above(ticket.rank)

    def over_cap(self, ticket: Ticket) -> bool:
        """A tenant's cap counts its seats in flight and its queued seats."""
        cap = self.cap(ticket.tenant)
        if cap is None:
            return False
        held = self.tenant_inflight(ticket.tenant) + self.tenant_queued(ticket.tenant)
        return held + ticket.seats > cap

    def take(self, ticket: Ticket) -> None:
        """Count ``ticket``'s seats as in flight (a grant decided by the caller)."""
        self._add_inflight(ticket.tenant, ticket.seats)

    def release(self, ticket: Ticket) -> None:
        """Give back the seats of a granted ticket; the caller then dispatches."""
        self._add_inflight(ticket.tenant, -ticket.seats)

    def enqueue(self, ticket: Ticket, since: float, handle: object = None) -> Waiter:
        waiter = Waiter(ticket, self._next_order, since, handle)
        self._next_order += 1
        rank, tenant = ticket.rank, ticket.tenant
        queue = self._queues[rank].get(tenant)
        if queue is None:
            queue = self._queues[rank][tenant] = deque()
        queue.append(waiter)
        self.queued += 1
        self._rank_queued[rank] += 1
        self._tenant_queued[tenant] = self._tenant_queued.get(tenant, 0) + 1
        if len(queue) == 1:
            self._push(rank, tenant)
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        """Take a waiter out of the queue (timeout, disconnect, eviction).

        Answers False when it was no longer waiting (already granted or removed), so the
        caller knows a grant won the race and the seats must be handed back instead.
        """
        if not waiter.alive:
            return False
        waiter.alive = False
        rank, tenant = waiter.ticket.rank, waiter.ticket.tenant
        self._forget_waiter(rank, tenant)
        queue = self._queues[rank][tenant]
        if queue[0] is waiter:
            self._drop_dead_heads(rank, tenant, queue)
        return True

    def pop_grantable(self, limit: int) -> Waiter | None:
        """Grant the next waiter if its seats fit under ``limit``; None when nobody may go."""
        for rank in _RANKS:
            heap = self._heaps[rank]
            versions = self._versions[rank]
            while heap:
                _, _, version, tenant = heap[0]
                if versions.get(tenant) != version:
                    heapq.heappop(heap)
                    continue
                queue = self._queues[rank][tenant]
                head = queue[0]
                if self.inflight + head.ticket.seats > limit:
                    return None
                heapq.heappop(heap)
                queue.popleft()
                head.alive = False
                self._forget_waiter(rank, tenant)
                self._drop_dead_heads(rank, tenant, queue)
                self._add_inflight(tenant, head.ticket.seats)
                return head
        return None

    def eviction_victim(self, rank: int) -> Waiter | None:
        """The oldest waiter of the heaviest tenant, never from a class above ``rank``.

        Heaviest means the largest ``(seats in flight + queued) / weight``; among that
        tenant's classes the least urgent one loses first.
        """
        best: tuple[float, int, str] | None = None
        for tenant, queued in self._tenant_queued.items():
            if not any(self._queues[r].get(tenant) for r in range(rank, len(PRIORITIES))):
                continue
            load = (self.tenant_inflight(tenant) + queued) / self.weight(tenant)
            key = (load, queued, tenant)
            if best is None or key > best:
                best = key
        if best is None:
            return None
        tenant = best[2]
        for r in reversed(range(rank, len(PRIORITIES))):
            queue = self._queues[r].get(tenant)
            if queue:
                return queue[0]
        return None

    # -- bookkeeping ----------------------------------------------------------------------

    def _add_inflight(self, tenant: str, seats: int) -> None:
        self.inflight += seats
        held = self._tenant_inflight.get(tenant, 0) + seats
        if held:
            self._tenant_inflight[tenant] = held
        else:
            self._tenant_inflight.pop(tenant, None)
        for rank in _RANKS:
            if tenant in self._queues[rank]:
                self._push(rank, tenant)

    def _forget_waiter(self, rank: int, tenant: str) -> None:
        self.queued -= 1
        self._rank_queued[rank] -= 1
        left = self._tenant_queued[tenant] - 1
        if left:
            self._tenant_queued[tenant] = left
        else:
            del self._tenant_queued[tenant]

    def _drop_dead_heads(self, rank: int, tenant: str, queue: deque[Waiter]) -> None:
        while queue and not queue[0].alive:
            queue.popleft()
        if queue:
            self._push(rank, tenant)
        else:
            del self._queues[rank][tenant]
            self._versions[rank].pop(tenant, None)

    def _push(self, rank: int, tenant: str) -> None:
        head = self._queues[rank][tenant][0]
        key = (self.tenant_inflight(tenant) + head.ticket.seats) / self.weight(tenant)
        self._next_version += 1
        self._versions[rank][tenant] = self._next_version
        heap = self._heaps[rank]
        heapq.heappush(heap, (key, head.order, self._next_version, tenant))
        if len(heap) > 64 and len(heap) > 4 * len(self._queues[rank]):
            self._compact(rank)

    def _compact(self, rank: int) -> None:
        versions = self._versions[rank]
        heap = [entry for entry in self._heaps[rank] if versions.get(entry[3]) == entry[2]]
        heapq.heapify(heap)
        self._heaps[rank] = heap
