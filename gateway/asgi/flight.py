"""``Flight``: one admission-controlled request, from its classification to the release of
its seats.

The middleware hands each HTTP request that is not exempt to a new ``Flight``, as
Starlette's middlewares hand a request to a responder. The flight holds what the request
gathers on its way (its ticket, body, permit and routing decision) instead of passing it
from call to call, and ends in one place, ``_land``: at the response's last chunk, through
the flight's own ``send``, else in the one ``finally`` around the app. What every flight
of one middleware shares (the gateway's parts, the settings it reads) is its
``FlightPlan`` (``plan.py``), built once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from gateway.asgi.body import RequestBody, client_left, declared_length, expects_continue
from gateway.asgi.plan import FlightPlan, keep_record, naming_upstream, record_of, routed_keys
from gateway.asgi.responses import answer_not_started, send_bad_request, send_rejection
from gateway.asgi.timing import ResponseTimer
from gateway.core.tickets import Ticket
from gateway.core.tickets import ticket as make_ticket
from gateway.errors import BadRequest, Disconnected, Rejected, Unroutable
from gateway.faults import PASSED_ON
from gateway.protocols import Classification, FreeSeats, Permit, RequestInfo
from gateway.rates.budgets import Refund
from gateway.rates.usage import UsageMeter
from gateway.routing.router import Decision
from gateway.telemetry import tallies
from gateway.telemetry.tracing import close_span, open_span
from gateway.types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class Flight:
    """One request on its way through the gateway; ``run()`` takes it from arrival to the
    release of its seats, answering 400/413/429/503 itself when it cannot run.

    What the caller may rely on: the seats (and the routing decision) are given back
    exactly once, at the response's last chunk or when the app returns, whichever comes
    first, however the app ends; a request refused or abandoned before the app runs holds
    nothing. When capacity providers follow the backends' latency (``FlightPlan.latency``),
    they are told the request's figures (``ResponseTimer``).
    """

    __slots__ = (
        "body",
        "classification",
        "decision",
        "permit",
        "plan",
        "receive",
        "reserved",
        "scope",
        "seats",
        "send",
        "span",
        "status",
        "ticket",
    )

    def __init__(self, plan: FlightPlan, scope: Scope, receive: Receive, send: Send) -> None:
        self.plan = plan
        self.scope = scope
        self.receive = receive
        self.send = send
        #: the body, once something read it (classifiers, routing, the disconnect watch)
        self.body: RequestBody | None = None
        #: the classifier's answer; None when the header-only path classified
        self.classification: Classification | None = None
        #: while the request holds seats: the free seats they were taken from, or else the
        #: ``permit`` the scheduler granted after a wait; both None once given back
        self.seats: FreeSeats | None = None
        self.permit: Permit | None = None
        self.decision: Decision | None = None
        #: gives back what the tenant's rate budgets reserved (None: nothing to give back)
        self.reserved: Refund | None = None
        #: the admission span, while the process traces and the gate has not answered
        self.span: Span | None = None
        #: the status of the response the app began through ``send`` (``_send``); 0 before
        self.status = 0

    async def run(self) -> None:
        plan = self.plan
        gateway = plan.gateway
        if not gateway.started and not await self._start():
            self._refused(tallies.REJECTED, "gateway_not_started", unclassified=True)
            return
        if gateway.tracer is not None:
            self.span = open_span(gateway.tracer, self.scope)
        scope = self.scope
        payload = None
        try:
            if plan.refuse_target is not None and (why := plan.refuse_target(scope)):
                raise BadRequest(why, code="invalid_path")
            if plan.reads_body and plan.reads(scope):
                self.body = RequestBody(self.receive, plan.max_body, declared_length(scope))
                payload = await self.body.read()
            if plan.header_ticket is not None:
                try:
                    self.ticket = plan.header_ticket(scope["headers"])
                except BadRequest:
                    raise
                except PASSED_ON:
                    raise
                except BaseException:  # a plugin's fault: named in the log, the request goes on
                    plan.plugins.header_ticket_failed()
                    self.ticket = plan.default_ticket
            else:
                self.ticket = self._classify(payload)
        except BadRequest as exc:
            self._refused(tallies.BAD_REQUEST, str(exc.status), unclassified=True)
            await send_bad_request(self.send, exc)
            return
        except Disconnected as exc:
            if exc.timed_out:  # answered 408 by BodyTimeout
                self._refused(tallies.BAD_REQUEST, "408", unclassified=True)
            else:
                self._refused(tallies.ABANDONED, unclassified=True)
            return
        if plan.budgets and not await self._budget(payload):
            return
        # a free seat is taken without a Permit: _land gives it back
        seats = plan.free_seats
        if seats is not None and seats.take(self.ticket):
            self.seats = seats
            if plan.observes:
                plan.plugins.admitted(self._info(), 0.0)
        elif not await self._wait():
            return
        observes = plan.observes
        if observes and self.body is None:  # tells whether the client left mid-response
            self.body = RequestBody(self.receive, plan.max_body)
        started = time.monotonic() if observes else 0.0
        outcome: str | None = tallies.ERROR
        try:
            if plan.reader is None:
                keep_record(self.scope, plan.admitted_record(self.ticket, self.permit))
            elif not await self._route(payload):
                outcome = None  # counted as unroutable
                return
            if self.span is not None:
                self._admitted_span()
            body = self.body
            send = self._send
            if plan.latency is not None:  # times the response for the providers
                send = ResponseTimer(send, plan.latency)
            if plan.meters_usage and plan.settles_usage(self.ticket.tenant, self.reserved):
                send = UsageMeter(send, self.settle_budget)
            await plan.app(scope, self.receive if body is None else body.replay, send)
            # a response whose seats came back at its last chunk is complete, whatever the
            # app read afterwards (a server answers receive() with a disconnect once the
            # response is done, and streaming responses listen); one unfinished, begun or
            # not, was cut short: by the client leaving (the rule when the flight does not
            # watch receive(): streams stop so, a proxy drops an upload cut half-way), else
            # by the app itself (a proxy whose upstream failed mid-stream)
            if not self._holds_seats:
                outcome = tallies.COMPLETED
            elif body is not None and body.disconnected:
                outcome = tallies.CANCELLED
            elif plan.answers_aside:  # a WSGI app's worker thread answered the client
                outcome = tallies.COMPLETED
            elif body is None:
                outcome = tallies.CANCELLED
            else:  # the client stayed: the app cut its answer short, or gave none
                outcome = tallies.ERROR
        except asyncio.CancelledError:
            outcome = tallies.CANCELLED
            raise
        except Exception as exc:  # the app failed, unless its client left mid-response:
            # the response unfinished, or a 5xx its failure sent (Starlette's error page)
            if (self._holds_seats or self.status >= 500) and client_left(exc, self.body):
                outcome = tallies.CANCELLED
            raise
        finally:
            self._land()
            if self.span is not None:  # the app never ran: routing raised or was cancelled
                self._admitted_span()
            if outcome is not None:
                plan.tallies.count(self.ticket, outcome)
            if observes:
                elapsed = time.monotonic() - started
                plan.plugins.finished(self._info(), elapsed, outcome or tallies.ERROR)

    async def _start(self) -> bool:
        """Start a gateway that was never started (no lifespan) or was stopped: its free
        seats stay closed until then. False when it cannot start: the request is
        answered 503 ``gateway_not_started``."""
        try:
            await self.plan.gateway.start()
        except Exception as exc:
            await answer_not_started(self.send, exc, self.plan.complaints, self.plan.retry_after_s)
            return False
        return True

    def _classify(self, payload: bytes | None) -> Ticket:
        plan = self.plan
        found = plan.plugins.classify(self.scope, payload) or plan.default
        self.classification = found
        return make_ticket(found.tenant, found.priority)

    async def _wait(self) -> bool:
        """Queue for seats, or answer 503/429; False when nobody is left to serve.

        While it waits, the client is watched for a disconnect (see
        ``RequestBody.watch_disconnect``); not a client that sent ``Expect: 100-continue``
        and no body yet: reading would tell the server to ask for the body, which such a
        client sends only to a server that will take it."""
        plan = self.plan
        body = self.body
        if body is None:
            body = self.body = RequestBody(self.receive, plan.max_body)
        watch = (
            None if not body.complete and expects_continue(self.scope) else body.watch_disconnect
        )
        asked = time.monotonic()
        try:
            permit = await plan.scheduler.acquire(self.ticket, disconnected=watch)
        except Rejected as exc:
            self.settle_budget()
            await self._reject(exc, waited_s=time.monotonic() - asked)
            return False
        except BaseException as exc:  # the client left, or the server cancelled the request
            self.settle_budget()
            self._refused(tallies.ABANDONED, waited_s=time.monotonic() - asked)
            if isinstance(exc, Disconnected):
                return False
            raise
        self.permit = permit
        waits = plan.gateway.queue_waits
        if waits:
            attributes = plan.wait_attributes[self.ticket.priority]
            for histogram in waits:
                histogram.record(permit.waited_s, attributes)
        if plan.observes:
            plan.plugins.admitted(self._info(), permit.waited_s)
        return True

    async def _budget(self, payload: bytes | None) -> bool:
        """Put the request's token estimate in its ticket (when the gate counts tokens) and
        take its share of the tenant's rate budgets; False when it is over one and was
        answered 429 (503 while they cannot be reached under ``closed``)."""
        plan = self.plan
        tokens = 0 if plan.tokens_of is None else plan.tokens_of(payload, self.scope)
        if plan.gate_tokens:
            self.ticket = self.ticket._replace(tokens=tokens)
        if plan.rates is None:
            return True
        reserved = await plan.rates.reserve(self.ticket.tenant, tokens)
        if isinstance(reserved, Rejected):
            await self._reject(reserved)
            return False
        self.reserved = reserved
        return True

    def settle_budget(self, used: int | None = None) -> None:
        """Settle what ``_budget`` took, once: give it back (the request was refused, or
        left, unserved), or correct it to the ``used`` tokens its response reported."""
        refund, self.reserved = self.reserved, None
        if refund is not None:
            refund(used)

    async def _reject(self, exc: Rejected, *, waited_s: float | None = None) -> None:
        """Answer a request the gateway refused (429/503), counted and observed."""
        self._refused(tallies.REJECTED, exc.reason, waited_s=waited_s)
        if self.plan.observes:
            self.plan.plugins.rejected(self._info(), exc.reason)
        await send_rejection(self.send, exc)

    async def _route(self, payload: bytes | None) -> bool:
        """Choose the upstream and put the choice in the record; False when no upstream
        can take the request and it was answered."""
        plan = self.plan
        assert plan.router is not None
        assert plan.reader is not None
        scope = self.scope
        request = plan.reader.read(
            scope["path"], scope["headers"], payload, self.ticket.tenant, self.classification
        )
        try:
            decision = self.decision = plan.router.route(request)
        except Unroutable as exc:
            self.settle_budget()
            self._refused(tallies.UNROUTABLE, exc.code)
            await plan.answer_unroutable(self.send, exc)
            return False
        if plan.plugins.observes_routing:
            plan.plugins.routed(self._info(), decision.upstream, decision.scores)
        waited_s = 0.0 if self.permit is None else self.permit.waited_s
        keep_record(self.scope, record_of(self.ticket, waited_s, **routed_keys(decision)))
        return True

    def _send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: gives the seats back (and ends the routing decision) when the
        app hands the server the response's last chunk, and names the upstream that
        answered in ``x-obleth-upstream`` when ``upstream_header`` is on.

        An app may take more event-loop turns to return after its last chunk (a proxy
        closing its upstream connection, a streaming response tearing down, background
        tasks), and the server may already be reading the client's next request on the
        same connection: it must not find the previous request's seat still taken. The
        work the seat stood for is done once the last chunk exists. A plain function
        returning ``send``'s awaitable, not a coroutine of its own: it runs twice per
        request."""
        kind = message["type"]
        if kind == "http.response.body":
            if not message.get("more_body", False):
                self._land()
        elif kind == "http.response.start":
            self.status = message["status"]
            if self.decision is None or not self.plan.names_upstream:
                return self.send(message)
            message = naming_upstream(message, self.decision)
        return self.send(message)

    def _land(self) -> None:
        """Give the seats back and end the routing decision; counts once, however often it
        is called (at the last chunk, then again by the ``finally`` around the app)."""
        if self.decision is not None:
            self.decision.finish()
        seats = self.seats
        if seats is not None:
            self.seats = None
            seats.give_back(self.ticket)
        elif self.permit is not None:
            self.permit.release()
            self.permit = None

    def _refused(
        self,
        outcome: str,
        reason: str = "",
        *,
        unclassified: bool = False,
        waited_s: float | None = None,
    ) -> None:
        """Count a request that the app never saw, and end its span: ``outcome`` (one of
        ``tallies``') and ``reason`` say why, ``waited_s`` how long it queued. ``unclassified``:
        before it had a ticket (see ``FlightPlan.ticket_of_refused``); its span names a
        tenant only when its headers did."""
        if unclassified:
            named = self.plan.ticket_of_refused(self.scope["headers"])
            self.ticket = self.plan.default_ticket if named is None else named
        else:
            named = self.ticket
        self.plan.tallies.count(self.ticket, outcome, reason)
        span = self.span
        if span is not None:
            self.span = None
            reason = reason or outcome
            close_span(span, self.scope, outcome, named, reason=reason, waited_s=waited_s)

    def _admitted_span(self) -> None:
        span = self.span
        assert span is not None
        self.span = None
        permit = self.permit
        close_span(
            span,
            self.scope,
            "admitted",
            self.ticket,
            waited_s=0.0 if permit is None else permit.waited_s,
            upstream=None if self.decision is None else self.decision.upstream,
        )

    @property
    def _holds_seats(self) -> bool:
        return self.seats is not None or self.permit is not None

    def _info(self) -> RequestInfo:
        scope = self.scope
        return RequestInfo(self.ticket.tenant, self.ticket.priority, scope["method"], scope["path"])
