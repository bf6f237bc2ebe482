"""The in-process counter backend: the default, for one pod.

Decisions run synchronously on the event loop, so admission and release never suspend;
a waiter sleeps on its own future until dispatch hands it seats.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from gateway.backends.siblings import Siblings, claim_listening_sockets
from gateway.capacity import Capacity
from gateway.core.admission import Granted, Queued, admit, dispatch
from gateway.core.fairqueue import FairQueue, Waiter
from gateway.core.tickets import Ticket
from gateway.errors import Rejected, RejectReason
from gateway.protocols import OverflowPolicy, Pending, Permit, Snapshot, TenantState
from gateway.settings import Settings

log = logging.getLogger("obleth")


class MemoryBackend:
    """Seats and the fair queue in this process; see ``gateway.protocols.CounterBackend``."""

    def __init__(self, settings: Settings, *, capacity: Capacity, policy: OverflowPolicy) -> None:
        self._settings = settings
        self._limit = capacity.current
        self._decide = policy.decide
        self._queue = LocalSeats(
            capacity=capacity, dispatch=self._dispatch, **_queue_options(settings)
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.free_seats = self._queue
        self._siblings = Siblings()

    async def start(self) -> None:
        """Open the seats; first, claim this process's listening sockets and log an error
        when another process already serves them with a budget of its own."""
        self._loop = asyncio.get_running_loop()
        if not self._siblings.addresses:
            self._siblings = claim_listening_sockets()
            others = self._siblings.pids()
            if others:
                log.error(self._shared_budget_message(others))
        self.free_seats.open = True

    async def stop(self) -> None:
        self.free_seats.open = False
        self._siblings.release()
        self._siblings = Siblings()
        for waiter in list(self._queue.waiters()):
            self._queue.remove(waiter)
            _fail(waiter, self._reject("unavailable"))

    async def acquire(self, ticket: Ticket) -> Permit | Pending:
        queue = self._queue
        if not queue.open:
            # not started, or stopped: nothing would ever time out or hand this request
            # a seat again; the caller answers 503 and a client retries elsewhere
            raise self._reject("unavailable")
        loop = self._loop or asyncio.get_running_loop()
        limit = self._limit()
        if queue.queued and queue.inflight < limit:
            # a provider read on every decision (one that does not announce its changes)
            # raised the limit since the last release: those waiting go first
            self._dispatch()
        verdict = admit(queue, ticket, limit, self._decide, now=loop.time())
        if isinstance(verdict, Granted):
            if queue.queued and queue.inflight < limit:
                # the grant moved its tenant back in the fair order: a waiter of a less
                # urgent class may be the first in line now, and fit (as in step.lua,
                # which dispatches after every call)
                self._dispatch()
            return Permit(ticket)
        if isinstance(verdict, Queued):
            # nothing can dispatch between admit() and here: the handle is set in time
            future: asyncio.Future[Permit] = loop.create_future()
            verdict.waiter.handle = future
            if verdict.evicted is not None:
                _fail(verdict.evicted, self._reject("evicted"))
            if queue.inflight < limit:
                # seats are free, but not enough for the first in line: the newcomer may
                # be the most deserving one that fits (as step.lua dispatches after queueing)
                self._dispatch()
            return Pending(ticket, future, verdict.waiter)
        raise self._reject(verdict.reason)

    def release(self, permit: Permit) -> None:
        self._queue.release(permit.ticket)
        if self._queue.queued:
            self._dispatch()

    def cancel(self, pending: Pending) -> None:
        waiter = pending.token
        assert isinstance(waiter, Waiter)
        if self._queue.remove(waiter):
            if self._queue.queued:
                # it may have been a head too large for the free seats, holding back a
                # smaller request behind it (step.lua dispatches after a cancel too)
                self._dispatch()
            return
        # dispatch granted it before the waiter gave up: the seats go to the next one
        future = pending.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release(future.result())

    def limit_changed(self) -> None:
        self._dispatch()

    async def settled(self) -> None:
        """Nothing to wait for: the limit in force is this process's own."""

    def shared_with_pids(self) -> tuple[int, ...]:
        """The other processes serving this one's listening sockets now, each with an
        in-process budget of its own (``uvicorn --workers``, gunicorn); sorted, empty when
        none (or when this platform cannot tell, or before ``start()``). Reads ``/proc``:
        for operators, not for the request path."""
        return self._siblings.pids()

    def snapshot(self) -> Snapshot:
        queue = self._queue
        tenants = {
            tenant: TenantState(
                inflight=queue.tenant_inflight(tenant),
                queued=queue.queued_by_class(tenant),
                weight=queue.weight(tenant),
            )
            for tenant in sorted(queue.tenants())
        }
        return Snapshot(
            limit=self._limit(),
            inflight=queue.inflight,
            queued=queue.queued,
            max_queue=queue.max_queue,
            tenants=tenants,
            tokens_inflight=queue.tokens_inflight if queue.max_tokens is not None else None,
            max_tokens=queue.max_tokens,
        )

    def _shared_budget_message(self, others: tuple[int, ...]) -> str:
        """One line: who shares the socket, what it costs in numbers, and the fix."""
        limit = self._limit()
        processes = len(others) + 1
        pids = f"pid{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        return (
            f"{pids} and this process (pid {os.getpid()}) serve the same listening socket "
            f"({', '.join(self._siblings.addresses)}), each with an in-process budget of its "
            f"own: each admits up to {limit} requests in flight "
            f"(global_max_in_flight={self._settings.global_max_in_flight}), so the backend "
            f"may receive {limit} x {processes} = {limit * processes} at once, more if more "
            "workers start. Set redis_url (OBLETH_REDIS_URL) so that all workers share one "
            "budget, or run one worker per pod."
        )

    def _reject(self, reason: RejectReason) -> Rejected:
        return Rejected.because(reason, retry_after_s=self._settings.retry_after_s)

    def _dispatch(self) -> None:
        handed_back = True
        while handed_back:
            handed_back = False
            for waiter in dispatch(self._queue, self._limit()):
                future = waiter.handle
                assert isinstance(future, asyncio.Future)
                if future.done():
                    # nobody is left to take these seats: give them back, dispatch again
                    self._queue.release(waiter.ticket)
                    handed_back = True
                    continue
                future.set_result(Permit(waiter.ticket))


class LocalSeats(FairQueue):
    """The in-process backend's fair queue, which also hands out its free seats
    (``FreeSeats``) on the request path.

    One object, so that a request makes one call to take its seats and one to give them
    back. The limit is read on every take (the announced value when every provider
    announces, without a call). No seat is free while the backend is not started
    (``open`` is False): callers then take the full path, which starts it.
    """

    def __init__(
        self, *, capacity: Capacity, dispatch: Callable[[], None], **queue_options: Any
    ) -> None:
        """``dispatch()`` hands seats to waiters; it is called when seats come back while
        someone waits. ``queue_options`` are ``FairQueue``'s."""
        super().__init__(**queue_options)
        self._capacity = capacity
        self._dispatch = dispatch
        self.taken = 0
        self.given_back = 0
        self.open = False

    def take(self, ticket: Ticket) -> bool:
        tenant = ticket.tenant
        seats = ticket.seats
        limit = self._capacity.settled
        if limit is None:
            limit = self._capacity.current()
        inflight = self.inflight + seats
        if self.queued or inflight > limit or not self.open:
            return False
        if self.capped and self.over_cap(ticket):
            return False
        counts_tokens = self.counts_tokens
        if counts_tokens and not self.fits(ticket, limit):
            return False
        # grant(ticket), written out: this runs on every request
        self.inflight = inflight
        held = self._tenant_inflight
        held[tenant] = held.get(tenant, 0) + seats
        if counts_tokens:
            self._count_tokens(ticket, 1)
        turns = self._turns  # turns.take(tenant), written out
        turns.count += 1
        turns.of[tenant] = turns.count
        self.taken += 1
        return True

    def give_back(self, ticket: Ticket) -> None:
        self.given_back += 1
        self.release(ticket)
        if self.queued:
            self._dispatch()

    def _release(self, permit: Permit) -> None:
        self.give_back(permit.ticket)


def fair_queue_for(settings: Settings) -> FairQueue:
    """An empty fair queue with the settings' bound, weights and caps."""
    return FairQueue(**_queue_options(settings))


def _queue_options(settings: Settings) -> dict[str, Any]:
    per_tenant, default_cap = settings.tenant_caps()
    return {
        "max_queue": settings.max_queue,
        "weights": settings.tenant_weights,
        "default_weight": settings.default_tenant_weight,
        "tenant_caps": per_tenant,
        "default_cap": default_cap,
        "max_tokens": settings.global_max_tokens_in_flight,
        "fair_by_tokens": settings.fairness_cost == "tokens",
    }


def _fail(waiter: Waiter, error: Rejected) -> None:
    future = waiter.handle
    assert isinstance(future, asyncio.Future)
    if not future.done():
        future.set_exception(error)
