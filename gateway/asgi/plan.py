"""``FlightPlan``: what every request through one middleware shares, looked up once when
the middleware is built: the gateway's parts and the settings the request path reads."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from gateway.asgi.body import reads_body
from gateway.asgi.responses import send_json_error
from gateway.asgi.timing import LatencyFeed
from gateway.complaints import Complaints
from gateway.core.memo import Memo
from gateway.core.tickets import PRIORITIES, Ticket, ticket
from gateway.errors import BadRequest, Unroutable
from gateway.faults import PASSED_ON
from gateway.gateway import Gateway
from gateway.protocols import Classification, Permit
from gateway.rates.budgets import NOTHING, Refund
from gateway.rates.estimate import request_tokens
from gateway.routing.request import RequestReader
from gateway.routing.router import Decision
from gateway.types import ASGIApp, Message, Scope, Send

log = logging.getLogger("obleth.capacity")

#: ``scope["state"]["obleth"]``: read-only, so one record can serve many requests
Record = Mapping[str, object]

#: How many tickets' records of requests admitted without waiting are kept for reuse.
_RECORDS_KEPT = 1024


def keep_record(scope: Scope, record: Record) -> None:
    """Put a request's record where its app reads it, ``scope["state"]["obleth"]``."""
    try:
        scope["state"]["obleth"] = record
    except (KeyError, TypeError):  # the server gave no state, or None
        scope["state"] = {"obleth": record}


def record_of(ticket: Ticket, waited_s: float, **routing: object) -> Record:
    """What the app can read about its admitted request, in ``scope["state"]["obleth"]``;
    ``routing``: a routed request's ``routed_keys``."""
    record = {"tenant": ticket.tenant, "priority": ticket.priority, "waited_s": waited_s}
    return MappingProxyType(record | routing)


def naming_upstream(start: Message, decision: Decision) -> Message:
    """The response start ``start`` with ``x-obleth-upstream``: the upstream that answered
    (``decision`` follows a retry), for ``upstream_header``."""
    named = (b"x-obleth-upstream", decision.upstream.encode("latin-1"))
    return {**start, "headers": [*start.get("headers", ()), named]}


def routed_keys(decision: Decision) -> dict[str, object]:
    """What a routed request's record says of its routing: ``upstream`` (the base URL
    chosen), ``scores`` (why) and ``route`` (the decision, which follows a retry)."""
    return {"upstream": decision.upstream, "scores": decision.scores, "route": decision}


class FlightPlan:
    """What every request through one middleware shares: the gateway's parts and the
    settings the request path reads, looked up once."""

    __slots__ = (
        "answers_aside",
        "app",
        "budgets",
        "complaints",
        "default",
        "default_ticket",
        "free_seats",
        "gate_tokens",
        "gateway",
        "header_ticket",
        "latency",
        "max_body",
        "meters_usage",
        "names_upstream",
        "observes",
        "plugins",
        "rates",
        "reader",
        "reads_body",
        "records",
        "refuse_target",
        "retry_after_s",
        "retry_unroutable_s",
        "routed_body",
        "router",
        "scheduler",
        "tallies",
        "tokens_of",
        "wait_attributes",
    )

    def __init__(
        self,
        app: ASGIApp,
        gateway: Gateway,
        complaints: Complaints,
        *,
        answers_aside: bool = False,
        refuse_target: Callable[[Scope], str | None] | None = None,
    ) -> None:
        """``answers_aside``: ``app`` answers the client some other way than through the
        ``send`` it is given (the WSGI adapter's worker thread does), so an app that
        returns without sending anything has answered. ``refuse_target``: see
        ``GatewayMiddleware``."""
        config = gateway.settings
        self.app = app
        self.answers_aside = answers_aside
        self.refuse_target = refuse_target
        self.gateway = gateway
        self.plugins = plugins = gateway.plugins
        self.scheduler = gateway.scheduler
        #: the backend's seats free right now (None when every grant needs I/O)
        self.free_seats = gateway.scheduler.free_seats
        self.router = router = gateway.router
        #: reads what routing needs of a request; None without upstreams
        self.reader = (
            None
            if router is None
            else RequestReader(
                router.fleet,
                block_bytes=config.prefix_block_bytes,
                session_header=config.session_header,
            )
        )
        self.header_ticket = plugins.header_ticket
        self.observes = plugins.observes
        #: the tenants' rate budgets (None when no tenant has one), and what a request
        #: reserves of tokens, from its JSON body (None when no budget counts tokens)
        self.rates = rates = gateway.rates
        self.tokens_of: Callable[[bytes | None, Scope], int] | None = None
        #: whether the gate counts tokens (a token budget, or fair by tokens): the ticket
        #: then carries the request's estimate
        self.gate_tokens = (
            config.global_max_tokens_in_flight is not None or config.fairness_cost == "tokens"
        )
        if self.gate_tokens or (rates is not None and rates.rules.counts_tokens):
            self.tokens_of = functools.partial(
                request_tokens, default_max_tokens=config.default_max_tokens
            )
        #: whether a classifier or the router reads JSON bodies; whether any body is read
        self.routed_body = plugins.wants_body or router is not None
        self.reads_body = self.routed_body or self.tokens_of is not None
        #: whether a served request's tokens are corrected to the usage its response reports
        self.meters_usage = rates is not None and rates.rules.counts_tokens
        #: whether a request has budgets to answer to (``Flight._budget``): the fast path
        #: of a gateway without them pays one check
        self.budgets = self.tokens_of is not None or rates is not None
        self.max_body = config.max_body_bytes
        self.default = Classification(config.default_tenant, config.default_priority)
        #: the default class's ticket (tickets are immutable: one serves every request)
        self.default_ticket = ticket(config.default_tenant, config.default_priority)
        self.names_upstream = bool(config.upstream_header)
        self.retry_after_s = config.retry_after_s
        #: a 503 for no healthy upstream may be retried after the next health check
        self.retry_unroutable_s = config.upstream_poll_interval_s
        #: the record of each recent ticket admitted without waiting nor routing, shared
        #: by its requests (records are read-only)
        self.records: Memo[Ticket, Record] = Memo(_RECORDS_KEPT)
        self.complaints = complaints
        #: how requests end, counted once each (the metrics read it)
        self.tallies = gateway.tallies
        #: the queue-wait histogram's attributes per priority class
        self.wait_attributes = {
            priority: {"pool": config.pool, "priority": priority} for priority in PRIORITIES
        }
        #: tells the providers that follow the backends' latency each admitted request's
        #: (``timing.py``); None when no provider does, and then a request pays nothing
        self.latency = LatencyFeed.of(gateway, complaints)

    def settles_usage(self, tenant: str, reserved: Refund | None) -> bool:
        """Whether a request of ``tenant`` that reserved ``reserved`` has its response read
        for the tokens it used (``gateway.rates.usage``): a tenant with a token budget."""
        if not self.meters_usage or reserved is None or reserved is NOTHING:
            return False
        assert self.rates is not None
        return self.rates.rules.of(tenant)[1] is not None

    def reads(self, scope: Scope) -> bool:
        """Whether this request's body is read before admission (see ``reads_body``)."""
        return reads_body(
            scope, self.max_body, routed=self.routed_body, priced=self.tokens_of is not None
        )

    def admitted_record(self, ticket: Ticket, permit: Permit | None) -> Record:
        """The record of a request admitted without routing: its own when it waited for
        ``permit``, else the one every such request of its ticket shares."""
        if permit is not None:
            return record_of(ticket, permit.waited_s)
        if ticket.tokens:  # one record per class, whatever the estimate
            ticket = ticket.of_class
        record = self.records.get(ticket)
        if record is None:
            record = self.records.keep(ticket, record_of(ticket, 0.0))
        return record

    def ticket_of_refused(self, headers: Iterable[tuple[bytes, bytes]]) -> Ticket | None:
        """The ticket of a request refused before it was classified (a body over
        ``max_body_bytes``, that paused, or that the client left half-way): the one its
        headers name when the classifier reads the headers alone, as the built-in one does
        (cheap, and known before the body); else None, since a classifier that reads the
        body never got one (the caller counts it under the default class). Called only on
        refusals."""
        header_ticket = self.header_ticket
        if header_ticket is not None:
            try:
                return header_ticket(headers)
            except BadRequest:
                pass  # the headers are what was refused
            except PASSED_ON:
                raise
            except BaseException:
                self.plugins.header_ticket_failed()
        return None

    async def answer_unroutable(self, send: Send, error: Unroutable) -> None:
        """Answer a request no upstream can take: the error's status, and for a 503 a
        ``Retry-After`` of the next health check."""
        retry = self.retry_unroutable_s if error.status == 503 else None
        await send_json_error(
            send, error.status, str(error), code=error.code, param=error.param, retry_after_s=retry
        )
