"""Turns among tenants that tie on seats held, on a virtual clock: with more tenants than
seats and a queue timeout, a tenant keeping one request waiting gets as many seats as
one keeping five, as max-min fairness in seats says it should."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter

from gateway.core.admission import Granted, Queued, admit, dispatch
from gateway.core.fairqueue import FairQueue, Waiter
from gateway.core.tickets import Ticket

SEATS = 2
#: seconds a request holds its seat, on average; its wait is bounded by three times that
SERVICE_S = 1.0
TIMEOUT_S = 3.0
HORIZON_S = 600.0


def seats_served(outstanding: dict[str, int], seed: int = 0) -> Counter[str]:
    """Closed-loop clients (``outstanding[tenant]`` each) on ``SEATS`` seats: a request
    that completes or times out is sent again at once. The seats each tenant got."""
    rng = random.Random(seed)
    queue = FairQueue(max_queue=1000)
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    served: Counter[str] = Counter()

    def at(when: float, kind: str, what: object) -> None:
        heapq.heappush(events, (when, next(order), kind, what))

    def run(now: float, ticket: Ticket) -> None:
        served[ticket.tenant] += 1
        at(now + SERVICE_S * rng.uniform(0.5, 1.5), "done", ticket)

    for tenant, count in outstanding.items():
        for _ in range(count):
            at(rng.random(), "send", tenant)
    while events:
        now, _, kind, what = heapq.heappop(events)
        if now > HORIZON_S:
            break
        if kind == "send":
            assert isinstance(what, str)
            ticket = Ticket(what)
            verdict = admit(queue, ticket, SEATS, lambda view, t: "queue", now=now)
            if isinstance(verdict, Granted):
                run(now, ticket)
            else:
                assert isinstance(verdict, Queued)
                at(now + TIMEOUT_S, "timeout", verdict.waiter)
        elif kind == "done":
            assert isinstance(what, Ticket)
            queue.release(what)
            at(now, "send", what.tenant)
        elif isinstance(what, Waiter) and queue.remove(what):
            at(now, "send", what.ticket.tenant)
        for waiter in dispatch(queue, SEATS):
            run(now, waiter.ticket)
    return served


def test_a_tenant_keeping_one_request_waiting_gets_as_many_seats_as_one_keeping_five() -> None:
    """Its one request used to time out before its turn came and go to the back when
    sent again (the turn was its arrival): 150 seats against 637 for the others."""
    outstanding = {**{f"one{n}": 1 for n in range(5)}, **{f"five{n}": 5 for n in range(5)}}
    served = seats_served(outstanding)
    assert min(served.values()) >= 0.9 * max(served.values()), served
