"""create_app: the simulated OpenAI-compatible backend as an ASGI (Starlette) application."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.errors import ConfigError
from gateway.sim.completions import CompletionEndpoint
from gateway.sim.config import SimConfig
from gateway.sim.engine import SimEngine
from gateway.sim.metrics import CONTENT_TYPE, render_metrics
from gateway.sim.stats import SimStats
from gateway.sim.wire import error_body


def create_app(config: SimConfig | None = None, engine: SimEngine | None = None) -> Starlette:
    """Build the simulator app around `engine` (or a new engine for `config`).

    Pass a config, an engine, or neither (defaults); passing both requires
    `engine.config is config`. The engine starts with the app's lifespan, or on the
    first completion request when the lifespan does not run (lifespan off, or the app
    mounted under something that does not forward it). Shutdown stops the engine if the
    lifespan started it.

    From Python, `app.state.engine` is the `SimEngine`, `app.state.stats` the `SimStats`
    (ground-truth concurrency: `app.state.stats.concurrency`, `.max_concurrency`,
    `.snapshot()`) and `app.state.config` the `SimConfig`. Read them from the event loop
    serving the app.

    Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
    GET /metrics, GET /sim/stats, POST /sim/reset (see docs/sim.md).
    """
    if engine is None:
        engine = SimEngine(config if config is not None else SimConfig())
    elif config is not None and config is not engine.config:
        raise ConfigError("config", config, "pass either a config or an engine, not both")
    sim_engine = engine
    stats = SimStats(sim_engine)
    model = sim_engine.config.model
    created = int(time.time())

    async def models(request: Request) -> Response:
        card = {"id": model, "object": "model", "created": created, "owned_by": "obleth-sim"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(render_metrics(model, stats.snapshot()), media_type=CONTENT_TYPE)

    async def sim_stats(request: Request) -> Response:
        return JSONResponse(stats.snapshot().as_dict())

    async def sim_reset(request: Request) -> Response:
        stats.reset()
        return JSONResponse(stats.snapshot().as_dict())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        started_here = not sim_engine.is_running
        await sim_engine.start()
        try:
            yield
        finally:
            if started_here:
                await sim_engine.stop()

    routes = [
        Route(
            "/v1/completions",
            CompletionEndpoint("completions", sim_engine, stats),
            methods=["POST"],
        ),
        Route(
            "/v1/chat/completions", CompletionEndpoint("chat", sim_engine, stats), methods=["POST"]
        ),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/reset", sim_reset, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    app.state.config = sim_engine.config
    app.state.engine = sim_engine
    app.state.stats = stats
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """An unknown path (404) or method (405) answered in OpenAI's error shape, as every
    other error of the simulator is, so that clients parse one kind of error body."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route {path}; see GET /v1/models and docs/sim.md"
    elif exc.status_code == 405 and exc.headers and "Allow" in exc.headers:
        message = f"{request.method} is not allowed on {path}; use {exc.headers['Allow']}"
    else:
        message = f"{path}: {exc.detail}"
    return JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers)
