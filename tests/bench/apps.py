"""The ASGI apps the overhead benchmark serves with uvicorn, one factory per variant.

Each factory is named on the uvicorn command line (``apps:with_gateway --factory``), so
every variant runs in a server process of its own, built from the same Starlette routes.
"""

from __future__ import annotations

import asyncio
import os
import time

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


class PassThroughMiddleware:
    """A pure ASGI middleware that does nothing but call the app: the floor, what any
    middleware layer costs a request before it does any work of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def trivial_app(middleware: list[Middleware] | None = None) -> Starlette:
    return Starlette(routes=[Route("/", hello)], middleware=middleware)


def bare() -> ASGIApp:
    """The trivial endpoint alone."""
    return trivial_app()


def bare_again() -> ASGIApp:
    """The trivial endpoint alone, in a second server: what two identical servers measure
    apart is the run's noise."""
    return trivial_app()


def with_gateway() -> ASGIApp:
    """The trivial endpoint behind ``GatewayMiddleware``, installed the documented way."""
    return trivial_app([Middleware(GatewayMiddleware, settings=TRIVIAL_SETTINGS)])


def with_semaphore() -> ASGIApp:
    """The trivial endpoint behind the naive semaphore middleware."""
    return trivial_app([Middleware(SemaphoreMiddleware, limit=64)])


def with_passthrough() -> ASGIApp:
    """The trivial endpoint behind a middleware that does nothing."""
    return trivial_app([Middleware(PassThroughMiddleware)])


class SlowEndpoint:
    """A 50 ms endpoint that counts how many requests run inside it at once, and how long
    its sleeps really took (a timer fires late by a fraction of a millisecond)."""

    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0
        self.completed = 0
        self.slept_s = 0.0

    async def work(self, request: Request) -> Response:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        started = time.perf_counter()
        try:
            await asyncio.sleep(SLOW_ENDPOINT_S)
        finally:
            self.running -= 1
        self.slept_s += time.perf_counter() - started
        self.completed += 1
        return PlainTextResponse("done")

    def stats(self) -> dict[str, float]:
        return {
            "running": self.running,
            "max_running": self.max_running,
            "completed": self.completed,
            "mean_sleep_ms": self.slept_s / max(self.completed, 1) * 1e3,
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


# -- cluster admission (cluster.py) ----------------------------------------------------------
#
# uvicorn calls a factory without arguments, so the cluster benchmark passes the Redis it
# started in the environment: BENCH_REDIS_URL, and BENCH_POOL for the gateway's pool name.
# They are not OBLETH_* variables: Settings.from_env would read those, and the benchmark's
# settings are fixed here, whatever the caller's environment holds.

#: The Redis variant's limit: far above the benchmark's concurrency, so nothing queues and
#: what is measured is one trip through the shared gate per request.
CLUSTER_LIMIT = 1000

#: slowapi's limit: generous enough that no request of a run is ever rejected.
SLOWAPI_LIMIT = "100000000/minute"


def _bench_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: this factory is started by tests/bench/cluster.py")
    return value


def cluster_settings(redis_url: str, pool: str) -> Settings:
    """Cluster mode as the benchmark runs it; ``learning_window_s=0`` because the pool is
    new and nobody has leases to re-assert."""
    return Settings(
        global_max_in_flight=CLUSTER_LIMIT,
        max_queue=4096,
        queue_timeout_s=30,
        redis_url=redis_url,
        pool=pool,
        learning_window_s=0,
    )


def with_redis_gateway() -> ASGIApp:
    """The trivial endpoint behind ``GatewayMiddleware`` in cluster mode (Redis backend)."""
    settings = cluster_settings(_bench_env("BENCH_REDIS_URL"), _bench_env("BENCH_POOL"))
    return trivial_app([Middleware(GatewayMiddleware, settings=settings)])


def with_slowapi() -> ASGIApp:
    """The trivial endpoint limited by slowapi with Redis storage: the peer.

    slowapi's documented setup (``@limiter.limit`` on the route, the limiter on
    ``app.state``, its 429 handler); the key is the client address. Each request makes
    one synchronous round trip to Redis (limits' fixed window: one script call).
    """
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri=_bench_env("BENCH_REDIS_URL"))

    @limiter.limit(SLOWAPI_LIMIT)
    async def limited_hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", limited_hello)])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    return app
