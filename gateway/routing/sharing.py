"""What gateway pods share for routing through Redis (cluster mode): in-flight counts per
upstream and where new prefixes were placed.

Each pod reports every ``SYNC_INTERVAL_S``, in one atomic call (``sharing.lua``): its own
counts, which come back summed over the other live pods, and the prefixes it placed since
its last report, which are appended to a shared placement record; the call returns the
entries recorded since the pod last read it. A pod's routing therefore sees its own
requests at once and the others' at most one interval late, and follows where another pod
placed a prefix from the next interval on (the first entry for a prefix wins). A pod that
stops reporting drops out of the counts after ``REPORT_TTL_S``.

When Redis cannot be reached the pod routes on its own counts (and the last known counts
of the others, until they are ``REPORT_TTL_S`` old) and its own placements, which it
shares once Redis answers again: routing goes on, only less informed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from gateway.core.placement import PlacementLog
from gateway.routing.inflight import InFlight
from gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger("obleth.routing")

SYNC_INTERVAL_S = 0.05
"""How often a pod reports and reads the others' reports."""
REPORT_TTL_S = 2.0
"""How long a pod's counts count without being renewed."""
RECORD_TTL_S = 24 * 3600.0
"""How long the placement record outlives the last pod that reported."""
PLACEMENTS_PER_SYNC = 1000
"""At most this many own placements are written per report; the rest wait for the next."""


class SharedRouting:
    """Keeps ``inflight`` and ``placements`` in step with the other pods; see the module."""

    def __init__(self, settings: Settings, inflight: InFlight, placements: PlacementLog) -> None:
        from gateway.backends.redis.connect import connect
        from gateway.backends.redis.keys import PoolKeys, new_pod_id

        assert settings.redis_url is not None
        self.inflight = inflight
        self.placements = placements
        self.pod = new_pod_id()
        keys = PoolKeys(settings.pool)
        self._keys = [
            keys.key("route:pods"),
            keys.key("route:pod:") + self.pod,
            keys.key("route:placements"),
            keys.key("route:placements:last"),
        ]
        self._prefix = keys.key("route:pod:")
        self._kept = placements.capacity
        self._client: Any = connect(
            settings.redis_url,
            pool_size=2,
            timeout_s=settings.redis_retry_budget_s,
            setting=settings.label("redis_url"),
        )
        source = resources.files("gateway.routing").joinpath("sharing.lua").read_text()
        self._script = self._client.register_script(source)
        self._task: asyncio.Task[None] | None = None
        self._last_heard = 0.0
        self._last_read = 0
        self._failing = False
        self.syncs = 0
        """Calls to Redis that succeeded (for tests and status pages)."""

    async def start(self) -> None:
        if self._task is None:
            await self.sync()
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Hand over the last placements, withdraw this pod's counts, disconnect."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        if self.placements.unshared(1):
            await self.sync()
        with contextlib.suppress(Exception):
            await self._client.delete(self._keys[1])
            await self._client.zrem(self._keys[0], self.pod)
        await self._client.aclose()

    async def sync(self) -> None:
        """Report this pod's counts and placements, take in the others'; never raises."""
        counts: list[str | int] = []
        for upstream, n in self.inflight.local().items():
            if n > 0:
                counts += [upstream, n]
        placed = self.placements.unshared(PLACEMENTS_PER_SYNC)
        args = [
            self.pod,
            int(REPORT_TTL_S * 1000),
            self._prefix,
            self._last_read,
            self._kept,
            int(RECORD_TTL_S * 1000),
            len(counts) // 2,
            *counts,
            *(f"{key} {upstream} {blocks}" for key, upstream, blocks in placed),
        ]
        try:
            last, learned, others = await self._script(keys=self._keys, args=args)
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "cannot share routing state through Redis (%s); routing on this "
                    "pod's own counts and placements until it answers",
                    exc,
                )
                self._failing = True
            if time.monotonic() - self._last_heard > REPORT_TTL_S:
                self.inflight.set_others({})
            return
        if self._failing:
            log.info("sharing routing state through Redis again")
            self._failing = False
        self.placements.shared(len(placed))
        for entry in learned:
            key, upstream, blocks = entry.split(" ")
            self.placements.learn(int(key), upstream, int(blocks))
        self._last_read = int(last)
        summed: dict[str, int] = {}
        for i in range(0, len(others) - 1, 2):
            upstream = others[i]
            summed[upstream] = summed.get(upstream, 0) + int(others[i + 1])
        self.inflight.set_others(summed)
        self._last_heard = time.monotonic()
        self.syncs += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            await self.sync()
