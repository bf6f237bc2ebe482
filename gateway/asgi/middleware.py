"""``GatewayMiddleware``: admission control in front of any ASGI app.

Per request: classify (tenant, priority), admit through the one gate (or answer 503/429),
run the app, release the seats exactly once when the app returns, however it returns.
The app returns only after its last body chunk is sent, so a streamed response keeps its
seats until its last token. Lifespan is wrapped, websockets and other scopes pass through,
exempt paths (health, metrics, admin) are never queued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from gateway.asgi.body import RequestBody
from gateway.asgi.lifespan import run_lifespan
from gateway.asgi.responses import send_bad_request, send_rejection
from gateway.core.tickets import Ticket
from gateway.core.tickets import ticket as make_ticket
from gateway.errors import BadRequest, Disconnected, Rejected
from gateway.gateway import Gateway
from gateway.protocols import Classification, Permit, RequestInfo
from gateway.settings import Settings
from gateway.types import ASGIApp, Receive, Scope, Send

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class GatewayMiddleware:
    """Admission control for an ASGI app.

    ``GatewayMiddleware(app)`` reads ``OBLETH_*`` settings from the environment;
    ``settings=`` or a ready ``gateway=`` may be given instead. Configuration and plugin
    errors are raised here, when the middleware is built, not on a request.

    What the app can rely on: ``scope["state"]["obleth"]`` holds ``tenant``, ``priority``
    and ``waited_s`` of the admitted request; the body it receives is the one the client
    sent, byte for byte.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings | None = None,
        *,
        gateway: Gateway | None = None,
        plugins: Iterable[object] = (),
    ) -> None:
        if gateway is not None and (settings is not None or plugins):
            raise TypeError("pass either gateway= or settings=/plugins=, not both")
        self.app = app
        self.gateway = gateway if gateway is not None else Gateway(settings, plugins=plugins)
        config = self.gateway.settings
        self._exempt = frozenset(config.exempt_paths)
        self._exempt_prefixes = tuple(path + "/" for path in config.exempt_paths if path != "/")
        self._max_body = config.max_body_bytes
        self._default = Classification(config.default_tenant, config.default_priority)
        self._plugins = self.gateway.plugins
        self._scheduler = self.gateway.scheduler
        self._observes = self._plugins.observes
        self._reads_body = self._plugins.wants_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await run_lifespan(self.gateway, self.app, scope, receive, send)
            return
        path = scope.get("path", "")
        if kind != "http" or path in self._exempt or path.startswith(self._exempt_prefixes):
            await self.app(scope, receive, send)
            return
        if not self.gateway.started:
            await self.gateway.start()
        # the fast path: classified from headers alone, a seat free and nobody waiting
        plugins = self._plugins
        body: RequestBody | None = None
        payload = None
        try:
            headers = plugins.headers_of(scope)
            if self._reads_body and _has_json_body(scope, headers):
                body = RequestBody(receive, self._max_body)
                payload = await body.read()
            classification = plugins.classify(scope, headers, payload) or self._default
        except BadRequest as exc:
            await send_bad_request(send, exc)
            return
        except Disconnected:
            return
        ticket = make_ticket(classification.tenant, classification.priority)
        permit = self._scheduler.try_acquire(ticket)
        if permit is None:
            if body is None:
                body = RequestBody(receive, self._max_body)
            permit = await self._wait_for_seat(ticket, scope, body, send)
            if permit is None:
                return
        elif self._observes:
            plugins.admitted(_info(ticket, scope), 0.0)
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state["obleth"] = {
            "tenant": ticket.tenant,
            "priority": ticket.priority,
            "waited_s": permit.waited_s,
        }
        if not self._observes:
            try:
                await self.app(scope, receive if body is None else body.replay, send)
            finally:
                permit.release()
            return
        await self._run_observed(scope, receive, send, body, permit)

    async def _wait_for_seat(
        self, ticket: Ticket, scope: Scope, body: RequestBody, send: Send
    ) -> Permit | None:
        """The full path: queue, or answer 503/429; None when nobody is left to serve."""
        try:
            permit = await self._scheduler.acquire(ticket, disconnected=body.watch_disconnect)
        except Rejected as exc:
            if self._observes:
                self._plugins.rejected(_info(ticket, scope), exc.reason)
            await send_rejection(send, exc)
            return None
        except Disconnected:
            return None
        if self._observes:
            self._plugins.admitted(_info(ticket, scope), permit.waited_s)
        return permit

    async def _run_observed(
        self, scope: Scope, receive: Receive, send: Send, body: RequestBody | None, permit: Permit
    ) -> None:
        """Run the app and tell observers how it ended (completed, error or cancelled)."""
        if body is None:
            body = RequestBody(receive, self._max_body)
        started = time.monotonic()
        outcome = "error"
        try:
            await self.app(scope, body.replay, send)
            outcome = "cancelled" if body.disconnected else "completed"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            permit.release()
            self._plugins.finished(_info(permit.ticket, scope), time.monotonic() - started, outcome)


def _info(ticket: Ticket, scope: Scope) -> RequestInfo:
    return RequestInfo(ticket.tenant, ticket.priority, scope["method"], scope["path"])


def _has_json_body(scope: Scope, headers: dict[str, str]) -> bool:
    """JSON bodies are read for classifiers that ask; anything else streams to the app."""
    return scope["method"] in _BODY_METHODS and headers.get("content-type", "").startswith(
        "application/json"
    )
