"""In-flight counts per upstream shared by every gateway pod through Redis (cluster mode).

Each pod reports its own counts every ``SYNC_INTERVAL_S`` and gets back the sum of the
other live pods' in the same atomic call (``shared_inflight.lua``). A pod's routing then
sees its own requests at once and the others' at most one interval late. A pod that stops
reporting (crashed, cut off) drops out after ``REPORT_TTL_S``.

When Redis cannot be reached the pod routes on its own counts (and the last known counts
of the others, until they are ``REPORT_TTL_S`` old): routing goes on, only less informed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from gateway.routing.inflight import InFlight

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger("obleth.routing")

SYNC_INTERVAL_S = 0.05
"""How often a pod reports its counts and reads the others'."""
REPORT_TTL_S = 2.0
"""How long a pod's report counts without being renewed."""


class SharedInFlight(InFlight):
    """``InFlight`` whose ``count(u)`` adds the other pods' requests on ``u``."""

    def __init__(self, settings: Settings, upstreams: list[str]) -> None:
        super().__init__(upstreams)
        from gateway.backends.redis.connect import connect
        from gateway.backends.redis.keys import PoolKeys, new_pod_id

        assert settings.redis_url is not None
        self.pod = new_pod_id()
        keys = PoolKeys(settings.pool)
        self._pods_key = keys.key("route:pods")
        self._prefix = keys.key("route:pod:")
        self._client: Any = connect(
            settings.redis_url,
            pool_size=2,
            timeout_s=settings.redis_retry_budget_s,
            setting=settings.label("redis_url"),
        )
        source = resources.files("gateway.routing").joinpath("shared_inflight.lua").read_text()
        self._script = self._client.register_script(source)
        self._task: asyncio.Task[None] | None = None
        self._last_heard = 0.0
        self._failing = False
        self.syncs = 0
        """Calls to Redis that succeeded (for tests and status pages)."""

    async def start(self) -> None:
        if self._task is None:
            await self.sync()
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(Exception):
                await self._client.delete(self._prefix + self.pod)
                await self._client.zrem(self._pods_key, self.pod)
            await self._client.aclose()

    async def sync(self) -> None:
        """Report this pod's counts and take in the others'; never raises."""
        counts: list[str | int] = []
        for upstream, n in self.local().items():
            if n > 0:
                counts += [upstream, n]
        try:
            reply = await self._script(
                keys=[self._pods_key, self._prefix + self.pod],
                args=[self.pod, int(REPORT_TTL_S * 1000), self._prefix, *counts],
            )
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "cannot share in-flight counts through Redis (%s); routing on "
                    "this pod's own counts until it answers",
                    exc,
                )
                self._failing = True
            if time.monotonic() - self._last_heard > REPORT_TTL_S:
                self.set_others({})
            return
        if self._failing:
            log.info("sharing in-flight counts through Redis again")
            self._failing = False
        others: dict[str, int] = {}
        for i in range(0, len(reply) - 1, 2):
            upstream = reply[i]
            others[upstream] = others.get(upstream, 0) + int(reply[i + 1])
        self.set_others(others)
        self._last_heard = time.monotonic()
        self.syncs += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            await self.sync()
