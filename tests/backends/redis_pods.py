"""Gateways ("pods") in one process sharing one pool in a real Redis, and the audit of
the pool's invariants read from Redis: shared by the cluster-mode backend tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway import Gateway, Settings
from gateway.backends.redis import RedisBackend
from gateway.backends.redis.audit import PoolAudit, audit
from gateway.backends.redis.connect import connect

TTL = 0.6  # heartbeat every 0.2 s

#: what every pod of these tests is started with, before each test's own settings
POD_SETTINGS: Mapping[str, Any] = {
    "lease_ttl_s": TTL,
    "redis_retry_budget_s": 0.3,
    "learning_window_s": 0,
}


class Pods:
    """Gateways sharing one pool; ``audit()`` reads the pool's invariants from Redis (with
    ``max_queue``, also that nobody waits for room while the queue has room).

    ``settings`` are every pod's, on top of ``POD_SETTINGS``; ``start`` may add more.
    """

    def __init__(
        self,
        url: str,
        pool: str,
        *,
        settings: Mapping[str, Any] | None = None,
        max_queue: int | None = None,
    ) -> None:
        self.url = url
        self.pool = pool
        self.settings = {**POD_SETTINGS, **(settings or {})}
        self.max_queue = max_queue
        self.started: list[Gateway] = []
        self.client = connect(url, pool_size=4, timeout_s=5)

    async def start(self, **settings: Any) -> Gateway:
        values = {"redis_url": self.url, "pool": self.pool, **self.settings, **settings}
        gateway = Gateway(Settings(**values), entry_points=False)
        await gateway.start()
        self.started.append(gateway)
        return gateway

    async def audit(self) -> PoolAudit:
        result = await audit(self.client, self.pool, max_queue=self.max_queue)
        assert result.ok, result.problems
        return result

    async def wait_empty(self, within_s: float) -> PoolAudit:
        deadline = time.monotonic() + within_s
        while True:
            result = await self.audit()
            if result.empty or time.monotonic() > deadline:
                return result
            await asyncio.sleep(0.05)

    async def drained(self) -> bool:
        """Whether, once every pod has said what it had to, nothing is held or waiting."""
        for gateway in self.started:
            if backend(gateway)._running:
                await backend(gateway).settled()
        found = await self.audit()
        return (found.inflight, found.waiters) == (0, 0)

    async def close(self) -> None:
        for gateway in self.started:
            await gateway.stop()
        await self.client.aclose()


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float) -> bool:
    """Whether ``check`` comes true within ``within_s`` (asked every 20 ms, then once more)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.02)
    return await check()


def backend(gateway: Gateway) -> RedisBackend:
    assert isinstance(gateway.backend, RedisBackend)
    return gateway.backend
