"""The verdict for one arriving request: grant, queue (maybe evicting someone), or refuse.

The overflow policy is consulted only when the request can neither be granted at once
nor refused by a rule that no policy may override (a tenant over its cap, a ``background``
request that may not wait). It answers one of four actions, which differ in what happens
when the queue (bounded by ``max_queue``) is full:

- ``"wait"`` (``block``): wait in the queue; when it is full, wait for room in the lobby,
  first come first served. Never refused for a full queue.
- ``"queue"`` (``drop-newest``): wait in the queue; when it is full, ``queue_full``.
- ``"evict"`` (``drop-oldest``): wait in the queue; when it is full, the oldest waiter of
  the heaviest tenant is evicted to make room (``queue_full`` when none may be).
- ``"reject"`` (``reject``): never wait: ``over_capacity`` (``queue_full`` when the queue
  is full).

The queue bound is an invariant, not a policy choice: only the lobby is outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.core.fairqueue import FairQueue, Waiter
from gateway.core.reasons import RejectReason
from gateway.core.tickets import NO_WAIT_RANK, Ticket

#: What an overflow policy may answer when no seat is free (see the module docstring).
OverflowAction = Literal["queue", "wait", "reject", "evict"]


class QueueView(Protocol):
    """What an overflow policy may look at; read-only by contract."""

    @property
    def inflight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def max_queue(self) -> int: ...
    @property
    def queue_full(self) -> bool: ...
    def tenant_inflight(self, tenant: str) -> int: ...
    def tenant_queued(self, tenant: str) -> int: ...
    def weight(self, tenant: str) -> float: ...


class QueueLook:
    """The ``QueueView`` an overflow policy gets of a ``FairQueue``: the figures it may
    read, and nothing it could change. A policy handed the queue itself could set its count
    of seats in flight, or grant and remove waiters, and break the limit for good."""

    __slots__ = ("_queue",)

    def __init__(self, queue: FairQueue) -> None:
        self._queue = queue

    @property
    def inflight(self) -> int:
        return self._queue.inflight

    @property
    def queued(self) -> int:
        return self._queue.queued

    @property
    def max_queue(self) -> int:
        return self._queue.max_queue

    @property
    def queue_full(self) -> bool:
        return self._queue.queue_full

    def tenant_inflight(self, tenant: str) -> int:
        return self._queue.tenant_inflight(tenant)

    def tenant_queued(self, tenant: str) -> int:
        return self._queue.tenant_queued(tenant)

    def weight(self, tenant: str) -> float:
        return self._queue.weight(tenant)


@dataclass(frozen=True, slots=True)
class Granted:
    """Seats counted as in flight; the request runs now."""


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits (in the queue or in its lobby); ``evicted`` was taken out of the
    queue to make room."""

    waiter: Waiter
    evicted: Waiter | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    reason: RejectReason


Verdict = Granted | Queued | Refused

_GRANTED = Granted()


def admit(
    queue: FairQueue,
    ticket: Ticket,
    limit: int,
    decide: Callable[[QueueView, Ticket], OverflowAction],
    *,
    now: float,
    handle: object = None,
) -> Verdict:
    """Decide for ``ticket`` against ``limit`` and apply the decision to ``queue``."""
    if queue.over_cap(ticket):
        return Refused("tenant_limit")
    if queue.can_grant_now(ticket, limit):
        queue.grant(ticket)
        return _GRANTED
    if ticket.rank >= NO_WAIT_RANK:
        return Refused("no_wait")
    action = decide(QueueLook(queue), ticket)
    if action == "wait":
        return Queued(queue.wait(ticket, now, handle))
    if action == "reject":
        # queue_full only when waiters fill it: with max_queue=0 nothing ever waits, and
        # what the newcomer lacks is a seat
        return Refused("queue_full" if queue.queued and queue.queue_full else "over_capacity")
    evicted = None
    if queue.queue_full:
        if action != "evict":
            return Refused("queue_full")
        evicted = queue.eviction_victim(ticket.rank)
        if evicted is None:
            return Refused("queue_full")
        queue.remove(evicted, refill=False)  # the newcomer takes its place
    return Queued(queue.enqueue(ticket, now, handle), evicted)


def dispatch(queue: FairQueue, limit: int) -> list[Waiter]:
    """Grant waiters, most deserving first, while their seats fit under ``limit``; the
    lobby's oldest enter the queue as grants make room."""
    granted = []
    while (waiter := queue.pop_grantable(limit)) is not None:
        granted.append(waiter)
    return granted
