"""The ASGI apps the overhead benchmark serves with uvicorn, one factory per variant.

Each factory is named on the uvicorn command line (``apps:with_gateway --factory``), so
every variant runs in a server process of its own, built from the same Starlette routes.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway import GatewayMiddleware, Settings
from gateway.types import ASGIApp, Receive, Scope, Send

#: The configuration the overhead target is stated for. The limit is above the trivial
#: benchmark's concurrency, so what it measures is passing through the gate, never waiting.
TRIVIAL_SETTINGS = Settings(global_max_in_flight=64, max_queue=4096, queue_timeout_s=30)

#: The queue benchmark: 256 clients share 64 seats of a 50 ms endpoint.
QUEUE_LIMIT = 64
SLOW_ENDPOINT_S = 0.05


class SemaphoreMiddleware:
    """The naive peer: a pure ASGI middleware around one ``asyncio.Semaphore``.

    No tenants, no fairness, no queue bound, no timeout: the least a limiter can do, and
    the yardstick for what the gateway's extra work costs.
    """

    def __init__(self, app: ASGIApp, limit: int = 64) -> None:
        self.app = app
        # asyncio primitives bind to the running loop on first use, not when made
        self._semaphore = asyncio.Semaphore(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with self._semaphore:
            await self.app(scope, receive, send)


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def trivial_app(middleware: list[Middleware] | None = None) -> Starlette:
    return Starlette(routes=[Route("/", hello)], middleware=middleware)


def bare() -> ASGIApp:
    """The trivial endpoint alone."""
    return trivial_app()


def with_gateway() -> ASGIApp:
    """The trivial endpoint behind ``GatewayMiddleware``, installed the documented way."""
    return trivial_app([Middleware(GatewayMiddleware, settings=TRIVIAL_SETTINGS)])


def with_semaphore() -> ASGIApp:
    """The trivial endpoint behind the naive semaphore middleware."""
    return trivial_app([Middleware(SemaphoreMiddleware, limit=64)])


class SlowEndpoint:
    """A 50 ms endpoint that counts how many requests run inside it at once."""

    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0
        self.completed = 0

    async def work(self, request: Request) -> Response:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(SLOW_ENDPOINT_S)
        finally:
            self.running -= 1
        self.completed += 1
        return PlainTextResponse("done")

    def stats(self) -> dict[str, int]:
        return {
            "running": self.running,
            "max_running": self.max_running,
            "completed": self.completed,
        }


def _slow_app(endpoint: SlowEndpoint, stats_route: Route) -> Starlette:
    return Starlette(routes=[Route("/work", endpoint.work), stats_route])


def slow_with_gateway() -> ASGIApp:
    """The 50 ms endpoint behind the gateway (limit 64); ``/stats`` is exempt from it."""
    endpoint = SlowEndpoint()

    async def stats(request: Request) -> Response:
        scheduler = middleware.gateway.scheduler
        snapshot = middleware.gateway.snapshot()
        return JSONResponse(
            {
                **endpoint.stats(),
                "admitted": scheduler.admitted,
                "released": scheduler.released,
                "rejected": dict(scheduler.rejected),
                "inflight": snapshot.inflight,
                "queued": snapshot.queued,
                "limit": snapshot.limit,
            }
        )

    settings = Settings(
        global_max_in_flight=QUEUE_LIMIT,
        max_queue=4096,
        queue_timeout_s=30,
        exempt_paths=("/stats",),
    )
    middleware = GatewayMiddleware(_slow_app(endpoint, Route("/stats", stats)), settings=settings)
    return middleware


def slow_with_semaphore() -> ASGIApp:
    """The 50 ms endpoint behind the naive semaphore (limit 64), for reference."""
    endpoint = SlowEndpoint()

    async def stats(request: Request) -> Response:
        return JSONResponse(endpoint.stats())

    inner = _slow_app(endpoint, Route("/stats", stats))
    limited = SemaphoreMiddleware(inner, limit=QUEUE_LIMIT)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # /stats must answer while every seat is taken
        if scope["type"] == "http" and scope["path"] == "/stats":
            await inner(scope, receive, send)
        else:
            await limited(scope, receive, send)

    return app


def slow_bare() -> ASGIApp:
    """The 50 ms endpoint with no limiter: the ceiling for 64 clients, sleep overshoot
    and server work included."""
    endpoint = SlowEndpoint()

    async def stats(request: Request) -> Response:
        return JSONResponse(endpoint.stats())

    return _slow_app(endpoint, Route("/stats", stats))
