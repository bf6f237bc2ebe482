"""A real HTTP client of a gateway's admin API served on a loopback port, and the token
the admin tests configure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from gateway import Gateway
from gateway.admin import admin_app
from gateway.loopback import serve_in_task

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
