"""Hypothesis drives the fair queue through random arrivals (under every overflow
action, ``wait`` included), releases, cancels and limit changes, checking after every step
what users rely on.

The queue is the in-process backend's (``LocalSeats``), so arrivals and releases go
through either the full path (``admit``, ``release`` then dispatch) or the request path's
free seats (``take``, ``give_back``), which count seats in one call each."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gateway.backends.memory import LocalSeats
from gateway.capacity import Capacity
from gateway.core.admission import (
    Granted,
    OverflowAction,
    Queued,
    QueueView,
    Refused,
    admit,
)
from gateway.core.fairqueue import Waiter
from gateway.core.tickets import PRIORITIES, Ticket

TENANTS = ("a", "b", "c")
WEIGHTS = {"a": 3.0, "b": 1.0, "c": 1.5}


class FairQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limit = 3
        # a provider read on every decision: the free seats see set_limit at once
        capacity = Capacity([("test", self)])
        self.queue = LocalSeats(
            capacity=capacity,
            dispatch=self._grant_all,
            max_queue=6,
            weights=WEIGHTS,
            tenant_caps={"c": 4},
        )
        self.queue.open = True
        self.held: list[Ticket] = []
        self.waiting: list[Waiter] = []
        self.released = 0
        self.admitted = 0
        self.served_orders: dict[tuple[str, str], list[int]] = {}

    # -- helpers ---------------------------------------------------------------------------

    def max_in_flight(self) -> int:
        """The capacity provider the free seats read."""
        return self.limit

    def _grant_all(self) -> None:
        """Dispatch, checking each grant against the max-min rule before it happens."""
        while True:
            before = {t: self.queue.tenant_inflight(t) for t in TENANTS}
            # those in the queue; the lobby is first come first served, outside the rule
            contenders = {
                (w.ticket.rank, w.ticket.tenant) for w in self.waiting if w not in self.queue.lobby
            }
            waiter = self.queue.pop_grantable(self.limit)
            if waiter is None:
                break
            ticket = waiter.ticket
            assert self.queue.inflight <= self.limit, "granted past the limit"
            # strict priority: nobody more urgent was waiting
            assert all(rank >= ticket.rank for rank, _ in contenders)
            # weighted max-min: no other tenant of this class deserved the seat more
            mine = (before[ticket.tenant] + 1) / WEIGHTS[ticket.tenant]
            for rank, other in contenders:
                if rank == ticket.rank and other != ticket.tenant:
                    assert mine <= (before[other] + 1) / WEIGHTS[other] + 1e-9
            self._take(waiter)

    def _take(self, waiter: Waiter) -> None:
        self.waiting.remove(waiter)
        self.held.append(waiter.ticket)
        self.admitted += 1
        key = (waiter.ticket.tenant, waiter.ticket.priority)
        self.served_orders.setdefault(key, []).append(waiter.order)

    # -- rules -----------------------------------------------------------------------------

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        action=st.sampled_from(("queue", "wait", "reject", "evict")),
    )
    def arrive(self, tenant: str, priority: str, action: OverflowAction) -> None:
        ticket = Ticket(tenant, priority)  # type: ignore[arg-type]
        someone_ahead = any(w.ticket.rank <= ticket.rank for w in self.waiting)
        # a tenant's load counts all it waits, but only waiters in the queue may be evicted
        loads = {
            w.ticket.tenant: (
                self.queue.tenant_inflight(w.ticket.tenant)
                + self.queue.tenant_queued(w.ticket.tenant)
            )
            / WEIGHTS[w.ticket.tenant]
            for w in self.waiting
            if w.ticket.rank >= ticket.rank and w not in self.queue.lobby
        }

        def policy(view: QueueView, t: Ticket) -> OverflowAction:
            return action

        verdict = admit(self.queue, ticket, self.limit, policy, now=0.0)
        if isinstance(verdict, Granted):
            assert not someone_ahead, "a newcomer barged past a waiter"
            assert self.queue.inflight <= self.limit
            self.held.append(ticket)
            self.admitted += 1
        elif isinstance(verdict, Queued):
            assert priority != "background", "background must never wait"
            if verdict.evicted is not None:
                victim = verdict.evicted
                assert victim.ticket.rank >= ticket.rank, "evicted a more urgent waiter"
                assert loads[victim.ticket.tenant] == max(loads.values()), "not the heaviest"
                mine = [
                    w
                    for w in self.waiting
                    if w.ticket.tenant == victim.ticket.tenant and w not in self.queue.lobby
                ]
                same_class = [w for w in mine if w.ticket.rank == victim.ticket.rank]
                assert victim.order == min(w.order for w in same_class), "not its oldest"
                self.waiting.remove(victim)
            self.waiting.append(verdict.waiter)
        else:
            assert isinstance(verdict, Refused)

    @rule(tenant=st.sampled_from(TENANTS))
    def arrive_on_the_request_path(self, tenant: str) -> None:
        """A free seat is taken exactly when the full path would grant one at once."""
        ticket = Ticket(tenant)
        tenant_total = sum(t.tenant == tenant for t in self.held) + sum(
            w.ticket.tenant == tenant for w in self.waiting
        )
        free = not self.waiting and len(self.held) < self.limit
        expected = free and (tenant != "c" or tenant_total < 4)
        assert self.queue.take(ticket) == expected
        if expected:
            self.held.append(ticket)
            self.admitted += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data(), given_back=st.booleans())
    def release(self, data: st.DataObject, given_back: bool) -> None:
        ticket = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.released += 1
        if given_back:  # the request path: give_back dispatches when someone waits
            self.queue.give_back(ticket)
        else:
            self.queue.release(ticket)
            self._grant_all()

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        waiter = self.waiting[data.draw(st.integers(0, len(self.waiting) - 1))]
        assert self.queue.remove(waiter)
        self.waiting.remove(waiter)

    @rule(limit=st.integers(1, 6))
    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._grant_all()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def counts_match_the_requests_we_know_of(self) -> None:
        assert self.queue.inflight == len(self.held)
        assert self.queue.queued + len(self.queue.lobby) == len(self.waiting)
        for tenant in TENANTS:
            assert self.queue.tenant_inflight(tenant) == sum(t.tenant == tenant for t in self.held)
        assert self.admitted - self.released == len(self.held)

    @invariant()
    def nobody_waits_while_a_seat_is_free(self) -> None:
        assert not self.waiting or self.queue.inflight >= self.limit

    @invariant()
    def queue_stays_bounded_and_caps_hold(self) -> None:
        assert self.queue.queued <= self.queue.max_queue
        # waiting for room only while the queue is full
        assert not self.queue.lobby or self.queue.queued >= self.queue.max_queue
        c_total = sum(t.tenant == "c" for t in self.held) + sum(
            w.ticket.tenant == "c" for w in self.waiting
        )
        assert c_total <= 4

    @invariant()
    def each_tenant_and_class_is_served_in_arrival_order(self) -> None:
        for orders in self.served_orders.values():
            assert orders == sorted(orders)

    def teardown(self) -> None:
        """No starvation: once load stops, every waiter is served and every seat returns."""
        steps = 0
        while self.held:
            self.queue.release(self.held.pop(0))
            self.released += 1
            self._grant_all()
            steps += 1
            assert steps < 1000
        assert self.waiting == []
        assert self.queue.inflight == 0 and self.queue.queued == 0
        assert self.admitted == self.released
        assert self.queue.tenants() == set()


FairQueueMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestFairQueueStates = FairQueueMachine.TestCase
