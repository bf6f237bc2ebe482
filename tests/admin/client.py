"""A real HTTP client of a gateway's admin API served on a loopback port, and the token
the admin tests configure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from gateway import Gateway, Settings
from gateway.admin import admin_app
from gateway.loopback import serve_in_task
from tests.backends.dial import Dial, DialPlugin
from tests.backends.redis_pods import POD_SETTINGS

TOKEN = "test-token-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def admin(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``gateway``'s admin API, served on a loopback port."""
    async with (
        serve_in_task(admin_app(gateway), lifespan="off") as server,
        httpx.AsyncClient(base_url=server.url, trust_env=False) as client,
    ):
        yield client


@asynccontextmanager
async def dialled_pod(redis_url: str, pool: str, dial: int = 4) -> AsyncIterator[Gateway]:
    """A started cluster-mode gateway with the admin API on, whose providers are
    ``static`` (10) and a computed ``dial`` answering ``dial``; stopped afterwards."""
    settings = Settings(
        redis_url=redis_url,
        pool=pool,
        admin_token=TOKEN,
        capacity_providers=("static", "dial"),
        global_max_in_flight=10,
        **POD_SETTINGS,
    )
    gateway = Gateway(settings, plugins=[DialPlugin(Dial(dial))], entry_points=False)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()
