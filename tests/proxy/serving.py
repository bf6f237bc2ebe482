"""The app ``obleth serve`` runs, with its uvicorn options, on a real server in this
process in front of an echoing upstream (or one a test brings): tests can read the
gateway's own state while a real HTTP client drives it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.admin import Probes
from gateway.admin.contract import ADMIN_PORT
from gateway.cli.serve import build_app, server_options
from gateway.loopback import serve_in_task
from gateway.scheduler import Scheduler
from gateway.settings import Settings
from gateway.telemetry.sdk import PrometheusExport
from gateway.types import ASGIApp
from tests.proxy.upstreams import Echo


@dataclass
class Served:
    url: str
    app: Probes
    upstream: ASGIApp

    @property
    def echo(self) -> Echo:
        assert isinstance(self.upstream, Echo), "served in front of another upstream"
        return self.upstream

    @property
    def scheduler(self) -> Scheduler:
        return self.app.gateway.scheduler


@contextlib.asynccontextmanager
async def serving(
    export: PrometheusExport | None = None,
    *,
    upstream: ASGIApp | None = None,
    admin_port: int = ADMIN_PORT,
    **settings: Any,
) -> AsyncIterator[Served]:
    """``obleth serve``'s app in front of ``upstream`` (default: an ``Echo``; another must
    answer ``GET /metrics`` 200 to count as healthy), returned once it routes;
    ``/metrics`` renders ``export`` (default: a private one); ``admin_port`` as
    ``--admin-port`` gives it."""
    app_upstream: ASGIApp = Echo() if upstream is None else upstream
    async with serve_in_task(app_upstream, lifespan="off") as upstream_server:
        config = Settings(
            upstreams=[upstream_server.url], upstream_poll_interval_s=0.05, **settings
        )
        app = build_app(config, export=export, admin_port=admin_port)
        async with (
            serve_in_task(app, **server_options(config)) as server,
            httpx.AsyncClient(trust_env=False) as http,
        ):

            async def ready() -> bool:
                return (await http.get(f"{server.url}/readyz")).status_code == 200

            for _ in range(250):
                if await ready():
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the gateway never saw its upstream healthy")
            yield Served(server.url, app, app_upstream)
