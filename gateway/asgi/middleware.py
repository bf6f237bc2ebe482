"""``GatewayMiddleware``: admission control in front of any ASGI app.

The middleware sorts scopes: lifespan is wrapped (the gateway starts and stops with the
server), websockets and other scopes pass through, exempt paths (health, metrics, admin)
go straight to the app (or, for an app that forwards them, are routed first: ``exempt.py``),
and every other HTTP request is handed to a ``Flight``
(``flight.py``), which classifies it, admits it through the one gate (or answers
503/429), routes it, runs the app and gives the seats back exactly once, at the
response's last chunk: a streamed response keeps its seats until its last token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import cast

from gateway.asgi.exempt import pass_routed
from gateway.asgi.flight import Flight
from gateway.asgi.lifespan import run_lifespan
from gateway.asgi.plan import FlightPlan
from gateway.asgi.responses import answer_not_started
from gateway.complaints import Complaints
from gateway.core.exemptions import ExemptPaths, route_path
from gateway.errors import OblethError
from gateway.gateway import Gateway, given
from gateway.settings import Settings
from gateway.types import ASGIApp, Receive, Scope, Send


class GatewayMiddleware:
    """Admission control for an ASGI app.

    ``GatewayMiddleware(app)`` reads ``OBLETH_*`` settings from the environment;
    ``settings=`` or a ready ``gateway=`` may be given instead. Configuration and plugin
    errors are raised here, when the middleware is built, not on a request; except when it
    is built while the event loop already runs, as Starlette builds its middleware on the
    first lifespan event: then the error fails the server's startup through lifespan
    (``lifespan.startup.failed``, with the message; ``run_lifespan`` says how it ends the
    process under a server that raises at that, as hypercorn does), since an exception
    there would let a server with ``lifespan="auto"`` serve without the gateway; and, for
    a server without lifespan, every request that is not exempt is answered 503
    ``gateway_not_started``.

    What the app can rely on: ``scope["state"]["obleth"]``, a read-only mapping, holds
    ``tenant``, ``priority`` and ``waited_s`` of the admitted request; the body it
    receives is the one the client sent, byte for byte. When upstreams are configured
    the record also holds ``upstream`` (the base URL chosen), ``scores`` (why) and
    ``route`` (the router's ``Decision``, whose ``upstream`` follows a retry on another
    upstream); the request counts against its upstream until its last chunk is sent.

    Requests on ``exempt_paths`` reach the app as they came, with no record. With
    ``route_exempt=True`` and upstreams configured, they are routed first (no seat, no
    queue; see ``gateway.asgi.exempt``) and their record holds ``upstream``, ``scores`` and
    ``route``: for an app that forwards every request to the chosen upstream, as
    ``ProxyApp`` does, which would otherwise have nowhere to send them.

    ``refuse_target(scope)``, when given, says why a request can never be served
    (``ProxyApp``'s ``unforwardable_path``: a dot segment, ``OPTIONS *``), or None: such a
    request is answered ``400 invalid_path`` before it is admitted, even while the gate is
    full, and counted as ``bad_request``; on an exempt path routed for the app
    (``route_exempt``), before it is routed.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings | None = None,
        *,
        gateway: Gateway | None = None,
        plugins: Iterable[object] = (),
        route_exempt: bool = False,
        refuse_target: Callable[[Scope], str | None] | None = None,
    ) -> None:
        self.app = app
        self._route_exempt = route_exempt
        self._complaints = Complaints()
        #: what every request shares; None while the gateway could not be assembled
        self._plan: FlightPlan | None = None
        try:
            self.gateway = given(settings, gateway, plugins)
        except OblethError as exc:
            if not _loop_running():
                raise
            self._fail_at_start(exc, settings)
            return
        self._exempt_paths(self.gateway.settings.exempt_paths)
        self._plan = FlightPlan(app, self.gateway, self._complaints, refuse_target=refuse_target)

    def _exempt_paths(self, paths: tuple[str, ...]) -> None:
        self._exempt = ExemptPaths(paths)

    def _fail_at_start(self, error: OblethError, settings: Settings | None) -> None:
        """Serve as a gateway that cannot start: lifespan reports ``error`` to the server,
        requests are answered 503 (see the class docstring), but for exempt paths: the
        health checks and metrics that tell operators so still reach the app (the paths
        of ``settings`` when they were given, else the default ones)."""
        self.gateway = cast(Gateway, _Unassembled(error))
        self._exempt_paths(settings.exempt_paths if settings is not None else Settings.exempt_paths)
        self._retry_after_s = (settings or Settings).retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await run_lifespan(self.gateway, self.app, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        path = scope["path"]
        if scope.get("root_path"):  # ``uvicorn --root-path``: matched below it, as apps route
            path = route_path(scope)
        if self._exempt.covers(path):
            if self._route_exempt and self._plan is not None:
                await pass_routed(self._plan, scope, receive, send)
            else:
                await self.app(scope, receive, send)
        elif self._plan is not None:
            await Flight(self._plan, scope, receive, send).run()
        else:
            error = cast(_Unassembled, self.gateway).error
            await answer_not_started(send, error, self._complaints, self._retry_after_s)


class _Unassembled:
    """What ``GatewayMiddleware.gateway`` holds when the gateway could not be assembled
    while the server ran: a gateway that never starts, whose ``start()`` raises the
    assembly error each time it is asked."""

    started = False

    def __init__(self, error: OblethError) -> None:
        self.error = error

    async def start(self) -> None:
        raise self.error.with_traceback(None)

    async def stop(self) -> None:
        pass


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
