"""Waiting for room (``block``, the ``"wait"`` action): the lobby outside the queue's
bound, on its own; no event loop, time passed in."""

from __future__ import annotations

import random

from gateway.core.admission import (
    Granted,
    OverflowAction,
    Queued,
    QueueView,
    Refused,
    Verdict,
    admit,
    dispatch,
)
from gateway.core.fairqueue import FairQueue, Waiter
from gateway.core.tickets import Priority, Ticket


def arrive(
    q: FairQueue,
    tenant: str,
    limit: int = 1,
    priority: Priority = "standard",
    action: OverflowAction = "wait",
    now: float = 0.0,
) -> Verdict:
    def policy(view: QueueView, ticket: Ticket) -> OverflowAction:
        return action

    return admit(q, Ticket(tenant, priority), limit, policy, now=now)


def queued(q: FairQueue, tenant: str, **kwargs: object) -> Waiter:
    verdict = arrive(q, tenant, **kwargs)  # type: ignore[arg-type]
    assert isinstance(verdict, Queued)
    return verdict.waiter


def release_one(q: FairQueue, tenant: str, limit: int = 1) -> list[Waiter]:
    """A request of ``tenant`` ends; who gets its seat."""
    q.release(Ticket(tenant))
    return dispatch(q, limit)


def room_invariant(q: FairQueue) -> bool:
    """The lobby is occupied only while the queue is full."""
    return not q.lobby or q.queued >= max(q.max_queue, 1)


def test_a_full_queue_never_refuses_a_request_that_waits_for_room() -> None:
    """Past ``max_queue`` the newcomer waits in the lobby; the queue keeps its bound."""
    q = FairQueue(max_queue=2)
    assert isinstance(arrive(q, "x"), Granted)
    verdicts = [arrive(q, t) for t in "abcde"]
    assert all(isinstance(v, Queued) for v in verdicts)
    assert (q.queued, len(q.lobby)) == (2, 3)
    assert [w.ticket.tenant for w in q.lobby] == ["c", "d", "e"]


def test_waiters_for_room_reach_seats_in_arrival_order_whatever_their_tenant() -> None:
    """First come first served: each grant makes room for the lobby's oldest."""
    q = FairQueue(max_queue=1, weights={"heavy": 1, "light": 8})
    arrive(q, "heavy")
    for tenant in ("heavy", "heavy", "light", "heavy", "light"):
        queued(q, tenant)
    served = []
    holder = "heavy"
    while q.queued:
        [granted] = release_one(q, holder)
        served.append(granted.ticket.tenant)
        holder = granted.ticket.tenant
        assert room_invariant(q)
    assert served == ["heavy", "heavy", "light", "heavy", "light"]


def test_once_in_the_queue_a_waiter_for_room_competes_by_priority() -> None:
    """The lobby is first come first served; the queue it leads to is not: a critical
    request that entered from the lobby goes before standard ones queued earlier."""
    q = FairQueue(max_queue=2)
    arrive(q, "x")
    first, second = queued(q, "a"), queued(q, "a")
    critical = queued(q, "c", priority="critical")
    assert critical in q.lobby
    assert release_one(q, "x") == [first]  # makes room: the critical request enters
    assert critical not in q.lobby
    assert release_one(q, "a") == [critical]
    assert release_one(q, "c") == [second]


def test_a_waiter_for_room_that_gives_up_leaves_and_is_never_granted() -> None:
    """A timeout or a disconnect takes a waiter out of the lobby like out of the queue."""
    q = FairQueue(max_queue=1)
    arrive(q, "x")
    head = queued(q, "a")
    gone, last = queued(q, "b"), queued(q, "c")
    assert q.remove(gone) is True
    assert q.remove(gone) is False
    assert gone not in q.lobby and q.tenant_queued("b") == 0
    assert release_one(q, "x") == [head]
    assert release_one(q, "a") == [last]
    assert (q.queued, len(q.lobby)) == (0, 0)


def test_room_left_by_a_cancel_in_the_queue_goes_to_the_lobbys_oldest() -> None:
    """Any room in the queue, not only a grant's, lets the lobby's oldest in."""
    q = FairQueue(max_queue=1)
    arrive(q, "x")
    head, older, newer = queued(q, "a"), queued(q, "b"), queued(q, "c")
    assert q.remove(head) is True
    assert older not in q.lobby and newer in q.lobby
    assert (q.queued, len(q.lobby)) == (1, 1)
    assert release_one(q, "x") == [older]


def test_a_waiter_for_room_keeps_its_arrival_time() -> None:
    """The wait a deadline bounds starts at arrival, not on entering the queue."""
    q = FairQueue(max_queue=1)
    arrive(q, "x")
    queued(q, "a", now=1.0)
    late = queued(q, "b", now=2.0)
    release_one(q, "x")
    assert late not in q.lobby and late.since == 2.0


def test_a_tenant_cap_counts_its_requests_waiting_for_room() -> None:
    """A tenant's cap counts what it runs, what it queues and what waits for room."""
    q = FairQueue(max_queue=1, tenant_caps={"t": 3})
    arrive(q, "t")
    queued(q, "t")
    queued(q, "t")
    assert q.tenant_queued("t") == 2 and len(q.lobby) == 1
    assert arrive(q, "t") == Refused("tenant_limit")
    assert q.queued_by_class("t") == {"critical": 0, "standard": 2, "background": 0}


def test_with_no_queue_a_request_under_block_still_waits_for_a_seat() -> None:
    """``max_queue = 0``: one request waits at the head and the rest for room, so block
    still serves in arrival order; the policies that answer ``queue_full`` refuse."""
    q = FairQueue(max_queue=0)
    arrive(q, "x")
    first, second = queued(q, "a"), queued(q, "b")
    assert (q.queued, len(q.lobby)) == (1, 1)
    assert arrive(q, "c", action="queue") == Refused("queue_full")
    assert arrive(q, "c", action="reject") == Refused("queue_full")
    assert release_one(q, "x") == [first]
    assert release_one(q, "a") == [second]


def test_an_eviction_gives_the_room_to_its_newcomer_not_to_the_lobby() -> None:
    """A newcomer that evicts takes the victim's place (the queue keeps its bound); a
    waiter from the lobby still keeps its arrival order within its tenant."""
    q = FairQueue(max_queue=2)
    arrive(q, "x")
    queued(q, "b")
    victim = queued(q, "a")
    earlier = queued(q, "a")  # waits for room
    verdict = arrive(q, "a", action="evict")
    assert isinstance(verdict, Queued) and verdict.evicted is victim
    assert (q.queued, len(q.lobby)) == (2, 1)
    [b] = release_one(q, "x")
    assert b.ticket.tenant == "b"  # its room lets `earlier` in, ahead of the evictor
    assert release_one(q, "b") == [earlier]
    assert release_one(q, "a") == [verdict.waiter]


def test_the_lobby_is_occupied_only_while_the_queue_is_full() -> None:
    """Whatever arrives, leaves, runs and ends, under any mix of policies' actions."""
    rng = random.Random(11)
    actions: list[OverflowAction] = ["wait", "wait", "queue", "evict", "reject"]
    for max_queue in (0, 1, 3):
        q = FairQueue(max_queue=max_queue, weights={"a": 2}, tenant_caps={"c": 5})
        running: list[Ticket] = []
        waiting: list[Waiter] = []
        for _ in range(3000):
            roll = rng.random()
            if roll < 0.45:
                ticket = Ticket(rng.choice("abc"), rng.choice(("critical", "standard")))
                verdict = admit(q, ticket, 3, lambda v, t: rng.choice(actions), now=0.0)
                if isinstance(verdict, Granted):
                    running.append(ticket)
                elif isinstance(verdict, Queued):
                    waiting.append(verdict.waiter)
                    if verdict.evicted is not None:
                        waiting.remove(verdict.evicted)
            elif roll < 0.8 and running:
                q.release(running.pop(rng.randrange(len(running))))
                for granted in dispatch(q, 3):
                    waiting.remove(granted)
                    running.append(granted.ticket)
            elif waiting:
                assert q.remove(waiting.pop(rng.randrange(len(waiting))))
            assert room_invariant(q)
            assert q.queued + len(q.lobby) == len(waiting)
            assert sum(q.tenant_queued(t) for t in "abc") == len(waiting)
