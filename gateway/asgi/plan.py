"""``FlightPlan``: what every request through one middleware shares, looked up once when
the middleware is built: the gateway's parts and the settings the request path reads."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.complaints import Complaints
from gateway.core.memo import Memo
from gateway.core.tickets import PRIORITIES, Ticket
from gateway.gateway import Gateway
from gateway.protocols import Classification
from gateway.routing.request import RequestReader
from gateway.types import ASGIApp

#: ``scope["state"]["obleth"]``: read-only, so one record can serve many requests
Record = Mapping[str, object]

#: How many tickets' records of requests admitted without waiting are kept for reuse.
_RECORDS_KEPT = 1024


class FlightPlan:
    """What every request through one middleware shares: the gateway's parts and the
    settings the request path reads, looked up once."""

    __slots__ = (
        "app",
        "complaints",
        "default",
        "free_seats",
        "gateway",
        "header_ticket",
        "max_body",
        "names_upstream",
        "observes",
        "plugins",
        "reader",
        "reads_body",
        "records",
        "retry_after_s",
        "retry_unroutable_s",
        "router",
        "scheduler",
        "tallies",
        "wait_attributes",
    )

    def __init__(self, app: ASGIApp, gateway: Gateway, complaints: Complaints) -> None:
        config = gateway.settings
        self.app = app
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
        self.reads_body = plugins.wants_body or router is not None
        self.max_body = config.max_body_bytes
        self.default = Classification(config.default_tenant, config.default_priority)
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
