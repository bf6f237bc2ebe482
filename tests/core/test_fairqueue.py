"""The fair queue and admission verdicts, on their own: no event loop, time passed in."""

from __future__ import annotations

import random

import pytest

from gateway.backends.redis.script import step_source
from gateway.core import turns
from gateway.core.admission import (
    Granted,
    OverflowAction,
    Queued,
    QueueView,
    Refused,
    admit,
    dispatch,
)
from gateway.core.fairqueue import FairQueue
from gateway.core.fairshare import fair_shares
from gateway.core.tickets import Priority, Ticket


def decide(action: OverflowAction):  # type: ignore[no-untyped-def]
    def policy(view: QueueView, ticket: Ticket) -> OverflowAction:
        return action

    return policy


QUEUE = decide("queue")


def arrive(
    q: FairQueue,
    tenant: str,
    limit: int,
    priority: Priority = "standard",
    action: OverflowAction = "queue",
) -> Granted | Queued | Refused:
    return admit(q, Ticket(tenant, priority), limit, decide(action), now=0.0)


def test_requests_are_granted_until_the_limit_then_queued() -> None:
    """Below the limit a request runs at once; at the limit it waits."""
    q = FairQueue(max_queue=10)
    assert [type(arrive(q, "a", 2)).__name__ for _ in range(3)] == ["Granted", "Granted", "Queued"]
    assert (q.inflight, q.queued) == (2, 1)


def test_newcomer_does_not_barge_past_waiters() -> None:
    """When a seat frees while others wait, the waiter gets it, not a newcomer."""
    q = FairQueue(max_queue=10)
    arrive(q, "a", 1)
    arrive(q, "b", 1)  # waits
    q.release(Ticket("a"))
    # a newcomer checking before dispatch ran must not take the seat
    assert isinstance(arrive(q, "c", 1), Queued)
    granted = dispatch(q, 1)
    assert [w.ticket.tenant for w in granted] == ["b"]


def test_background_never_waits() -> None:
    """A background request is admitted at once or refused with no_wait."""
    q = FairQueue(max_queue=10)
    assert isinstance(arrive(q, "a", 1, "background"), Granted)
    assert arrive(q, "a", 1, "background") == Refused("no_wait")


def test_background_does_not_pass_queued_requests() -> None:
    """Even with a seat free, background yields to anyone already waiting."""
    q = FairQueue(max_queue=10)
    arrive(q, "a", 1)
    arrive(q, "b", 1)
    q.release(Ticket("a"))
    assert arrive(q, "c", 1, "background") == Refused("no_wait")


def test_critical_is_served_before_standard() -> None:
    """Strict priority: queued critical requests go first, whatever their tenant's share."""
    q = FairQueue(max_queue=10)
    arrive(q, "a", 1)
    arrive(q, "light", 1)  # standard, waits first
    arrive(q, "a", 1, "critical")  # heavy tenant, but critical
    q.release(Ticket("a"))
    assert [(w.ticket.tenant, w.ticket.priority) for w in dispatch(q, 1)] == [("a", "critical")]


def test_critical_may_not_jump_queued_critical() -> None:
    """A critical newcomer waits behind critical requests already queued."""
    q = FairQueue(max_queue=10)
    arrive(q, "a", 1)
    arrive(q, "b", 1, "critical")
    assert isinstance(arrive(q, "c", 1, "critical"), Queued)


def test_lighter_tenant_gets_the_next_seat() -> None:
    """The next seat goes to the tenant holding the fewest seats per unit of weight."""
    q = FairQueue(max_queue=10, weights={"gold": 3})
    for _ in range(3):
        arrive(q, "gold", 4)
    arrive(q, "free", 4)  # gold 3/3=1, free 1/1=1 -> limit 4 reached
    arrive(q, "gold", 4)
    arrive(q, "free", 4)
    q.release(Ticket("gold"))
    # gold: (2+1)/3 = 1 < free: (1+1)/1 = 2
    assert [w.ticket.tenant for w in dispatch(q, 4)] == ["gold"]
    q.release(Ticket("free"))
    # gold: (3+1)/3 = 1.33 > free: (0+1)/1 = 1
    assert [w.ticket.tenant for w in dispatch(q, 4)] == ["free"]


def test_ties_go_to_the_oldest_head() -> None:
    """Equal shares: the tenant whose head arrived first is served first."""
    q = FairQueue(max_queue=10)
    arrive(q, "x", 1)
    arrive(q, "b", 1)
    arrive(q, "a", 1)
    q.release(Ticket("x"))
    assert [w.ticket.tenant for w in dispatch(q, 1)] == ["b"]


def test_requests_of_one_tenant_are_served_in_arrival_order() -> None:
    """FIFO within a tenant and class."""
    q = FairQueue(max_queue=10)
    arrive(q, "x", 1)
    waiters = [arrive(q, "a", 1) for _ in range(3)]
    orders = [w.waiter.order for w in waiters if isinstance(w, Queued)]
    served = []
    for _ in range(3):
        q.release(Ticket("x" if not served else "a"))
        served += [w.order for w in dispatch(q, 1)]
    assert served == orders


def test_tenant_cap_counts_running_and_waiting() -> None:
    """A tenant at its cap is refused 429-style, others are not affected."""
    q = FairQueue(max_queue=10, tenant_caps={"free": 2})
    assert isinstance(arrive(q, "free", 1), Granted)
    assert isinstance(arrive(q, "free", 1), Queued)
    assert arrive(q, "free", 1) == Refused("tenant_limit")
    assert isinstance(arrive(q, "gold", 1), Queued)


def test_default_cap_applies_to_every_tenant() -> None:
    """A default cap limits tenants not listed by name."""
    q = FairQueue(max_queue=10, default_cap=1)
    arrive(q, "a", 5)
    assert arrive(q, "a", 5) == Refused("tenant_limit")
    assert isinstance(arrive(q, "b", 5), Granted)


@pytest.mark.parametrize(
    ("action", "expected"),
    [("queue", Refused("queue_full")), ("reject", Refused("queue_full"))],
)
def test_full_queue_refuses_the_newcomer(action: OverflowAction, expected: Refused) -> None:
    """With drop-newest ("queue") and with reject, a full queue answers queue_full."""
    q = FairQueue(max_queue=1)
    arrive(q, "a", 1)
    arrive(q, "a", 1)
    assert arrive(q, "b", 1, action=action) == expected


@pytest.mark.parametrize("action", ["queue", "reject"])
def test_with_no_queue_at_all_reject_answers_over_capacity(action: OverflowAction) -> None:
    """With ``max_queue=0`` (nothing may wait), the built-in ``reject`` answers what the
    newcomer lacks, a seat (``over_capacity``), as docs/configuration.md says; it used to
    answer ``queue_full``. ``queue`` (drop-newest) still finds no room."""
    q = FairQueue(max_queue=0)
    arrive(q, "a", 1)
    expected = "over_capacity" if action == "reject" else "queue_full"
    assert arrive(q, "b", 1, action=action) == Refused(expected)


def test_reject_policy_refuses_at_once_when_no_seat_is_free() -> None:
    """reject never queues: over_capacity while the queue is not full."""
    q = FairQueue(max_queue=10)
    arrive(q, "a", 1)
    assert arrive(q, "b", 1, action="reject") == Refused("over_capacity")
    assert q.queued == 0


def test_eviction_drops_the_oldest_waiter_of_the_heaviest_tenant() -> None:
    """drop-oldest makes room by evicting the flooder's oldest waiter, not the newcomer."""
    q = FairQueue(max_queue=3)
    arrive(q, "flood", 1)
    oldest = arrive(q, "flood", 1, action="evict")
    arrive(q, "flood", 1, action="evict")
    arrive(q, "light", 1, action="evict")
    verdict = arrive(q, "light", 1, action="evict")
    assert isinstance(verdict, Queued) and isinstance(oldest, Queued)
    assert verdict.evicted is oldest.waiter
    assert q.queued == 3


def test_eviction_never_takes_a_more_urgent_waiter() -> None:
    """A standard newcomer cannot evict a critical waiter: it is refused instead."""
    q = FairQueue(max_queue=1)
    arrive(q, "a", 1)
    arrive(q, "a", 1, "critical")
    assert arrive(q, "b", 1, action="evict") == Refused("queue_full")


def test_removed_waiter_is_never_granted() -> None:
    """A waiter that timed out or left is skipped; its turn goes to the next one."""
    q = FairQueue(max_queue=10)
    arrive(q, "x", 1)
    first = arrive(q, "a", 1)
    arrive(q, "b", 1)
    assert isinstance(first, Queued)
    assert q.remove(first.waiter) is True
    assert q.remove(first.waiter) is False
    q.release(Ticket("x"))
    assert [w.ticket.tenant for w in dispatch(q, 1)] == ["b"]


def test_raising_the_limit_grants_waiters_at_once() -> None:
    """Dispatch with a higher limit admits as many waiters as now fit."""
    q = FairQueue(max_queue=10)
    for _ in range(5):
        arrive(q, "a", 1)
    assert len(dispatch(q, 4)) == 3
    assert q.inflight == 4


def test_lowering_the_limit_revokes_nothing() -> None:
    """Running requests keep their seats; new grants wait until in-flight drops below."""
    q = FairQueue(max_queue=10)
    for _ in range(4):
        arrive(q, "a", 4)
    arrive(q, "a", 4)
    q.release(Ticket("a"))
    assert dispatch(q, 2) == []
    assert q.inflight == 3


def test_backlogged_tenants_hold_seats_in_proportion_to_weight() -> None:
    """Over a long run with random durations, seat-time shares match weighted max-min."""
    rng = random.Random(7)
    weights = {"a": 4.0, "b": 2.0, "c": 1.0}
    limit = 14
    q = FairQueue(max_queue=10_000, weights=weights)
    held: list[Ticket] = []
    seat_time = dict.fromkeys(weights, 0.0)
    for tenant in weights:
        for _ in range(20):
            verdict = admit(q, Ticket(tenant), limit, QUEUE, now=0.0)
            if isinstance(verdict, Granted):
                held.append(Ticket(tenant))
    for _ in range(20_000):
        for ticket in held:
            seat_time[ticket.tenant] += 1
        done = held.pop(rng.randrange(len(held)))
        q.release(done)
        held += [w.ticket for w in dispatch(q, limit)]
        admit(q, Ticket(done.tenant), limit, QUEUE, now=0.0)  # stay backlogged
    total = sum(seat_time.values())
    target = fair_shares(limit, dict.fromkeys(weights, 1e9), weights)
    for tenant in weights:
        assert seat_time[tenant] / total == pytest.approx(target[tenant] / limit, rel=0.05)


def test_idle_tenants_keep_their_turns_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tenants come and go (a tenant per API key): an idle one keeps its turn for its
    next request, but only the last ``IDLE_TURNS`` to go idle do, so that memory stays
    bounded however many tenants a service has seen."""
    monkeypatch.setattr(turns, "IDLE_TURNS", 3)
    q = FairQueue(max_queue=10)
    for n in range(10):
        assert isinstance(arrive(q, f"t{n}", 1), Granted)
        q.release(Ticket(f"t{n}"))
    assert sorted(q._turns.of) == ["t7", "t8", "t9"]
    assert q._turns.idle == 3


def test_step_script_keeps_as_many_idle_turns_as_the_fair_queue() -> None:
    """In cluster mode the pool keeps idle turns in Redis: the same bound."""
    source = step_source()
    assert f"local IDLE_TURNS = {turns.IDLE_TURNS}\n" in source
