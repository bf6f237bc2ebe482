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
from typing import Any

from gateway.asgi.body import RequestBody
from gateway.asgi.lifespan import run_lifespan
from gateway.asgi.responses import send_bad_request, send_rejection
from gateway.core.tickets import Ticket
from gateway.errors import BadRequest, Disconnected, Rejected
from gateway.gateway import Gateway
from gateway.protocols import Classification, RequestInfo
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            if path not in self._exempt and not path.startswith(self._exempt_prefixes):
                await self._admit_and_run(scope, receive, send)
                return
        elif kind == "lifespan":
            await run_lifespan(self.gateway, self.app, scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _admit_and_run(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway = self.gateway
        if not gateway.started:
            await gateway.start()
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        body = RequestBody(receive, self._max_body)
        try:
            payload = await body.read() if _wants_body(scope, headers) else None
            classification = self._plugins.classify(scope, headers, payload) or self._default
        except BadRequest as exc:
            await send_bad_request(send, exc)
            return
        except Disconnected:
            return
        observes = self._plugins.observes
        info = (
            RequestInfo(
                classification.tenant, classification.priority, scope["method"], scope["path"]
            )
            if observes
            else None
        )
        try:
            permit = await self._scheduler.acquire(
                Ticket(classification.tenant, classification.priority),
                disconnected=body.watch_disconnect,
            )
        except Rejected as exc:
            if info is not None:
                self._plugins.rejected(info, exc.reason)
            await send_rejection(send, exc)
            return
        except Disconnected:
            return
        if info is not None:
            self._plugins.admitted(info, permit.waited_s)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["obleth"] = {
            "tenant": classification.tenant,
            "priority": classification.priority,
            "waited_s": permit.waited_s,
        }
        started = time.monotonic() if observes else 0.0
        outcome = "error"
        try:
            await self.app(scope, body.replay, send)
            outcome = "cancelled" if body.disconnected else "completed"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            permit.release()
            if info is not None:
                self._plugins.finished(info, time.monotonic() - started, outcome)


def _wants_body(scope: Scope, headers: dict[str, str]) -> bool:
    """JSON bodies are read for classification; anything else streams to the app as is."""
    return scope["method"] in _BODY_METHODS and headers.get("content-type", "").startswith(
        "application/json"
    )
