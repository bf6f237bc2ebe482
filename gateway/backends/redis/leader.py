"""The leader lease: which pod of a pool computes the computed capacity providers.

One key, ``obleth:{<pool>}:leader``, holds the holder's pod id with a TTL of
``lease_ttl_s`` on Redis' own clock (``leader.lua``). Every pod with computed providers
asks for it at its heartbeat's pace (a third of the TTL): the holder renews it, the others
find it taken, and learn from Redis how long it has left. A holder that dies stops
renewing, so its lease runs out within one TTL of its last renewal; the others ask again
the moment Redis said it would run out, so another pod holds it within about one lease TTL
of the death. A pod never trusts its own clock for the lease beyond the duration Redis
gave it, counted from before it asked.

Believing one leads is not enough to write: the step script takes computed values only
from the pod Redis names as the holder, so a pod that was frozen or cut off past its
lease changes nothing when it comes back.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from gateway.backends.redis.calls import FAILED
from gateway.backends.redis.connect import Client
from gateway.backends.redis.keys import PoolKeys

#: How long after the holder's lease was due to run out a waiting pod asks again: enough
#: for Redis to have expired the key (it does so on access, at the millisecond).
AFTER_EXPIRY_S = 0.005


@cache
def leader_source() -> str:
    return files("gateway.backends.redis").joinpath("leader.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Tenure:
    """Who holds the lease, as one call found it, and for how long yet (ms, Redis' word)."""

    holder: str | None
    left_ms: int


class LeaderLease:
    """One pod's side of the pool's leader lease.

    ``leading()`` is True while this pod holds the lease as far as Redis last said, for
    the duration Redis gave; ``holder`` is the pod that held it at the last answer (None
    before the first, or when it was free). ``on_gained`` is called each time this pod
    takes the lease (not when it renews it).
    """

    def __init__(
        self,
        client: Client,
        keys: PoolKeys,
        pod: str,
        *,
        ttl_s: float,
        on_gained: Callable[[], None] = lambda: None,
    ) -> None:
        self.pod = pod
        self.holder: str | None = None
        self._key = keys.leader
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._interval_s = ttl_s / 3
        self._script: Any = client.register_script(leader_source())
        self._on_gained = on_gained
        self._until = 0.0  # monotonic time until which this pod leads, as Redis said

    def leading(self) -> bool:
        return self.holder == self.pod and time.monotonic() < self._until

    async def hold(self) -> Tenure:
        """Take the lease if it is free, renew it if this pod holds it; one round trip.
        Raises what the client raises when Redis cannot be reached."""
        asked_at = time.monotonic()
        led = self.leading()
        holder, left_ms = await self._script(
            keys=[self._key], args=[self.pod, self._ttl_ms, "hold"]
        )
        tenure = Tenure(_text(holder) or None, int(left_ms))
        self.holder = tenure.holder
        if tenure.holder == self.pod:
            self._until = asked_at + tenure.left_ms / 1000
            if not led:
                self._on_gained()
        return tenure

    async def resign(self) -> None:
        """Give the lease up, if this pod holds it, so that another pod takes it at its
        next try instead of after a TTL (a pod stopping cleanly)."""
        self._until = 0.0
        await self._script(keys=[self._key], args=[self.pod, self._ttl_ms, "resign"])
        self.holder = None

    async def keep(self, running: Callable[[], bool]) -> None:
        """Ask for the lease at the heartbeat's pace while ``running()``; a pod that finds
        it taken asks again as soon as Redis said it would run out."""
        while running():
            delay = self._interval_s * random.uniform(0.8, 1.0)  # noqa: S311 (jitter)
            try:
                tenure = await self.hold()
            except FAILED:
                tenure = None  # Redis cannot be reached: try again at the next beat
            if tenure is not None and tenure.holder not in (None, self.pod):
                delay = min(delay, tenure.left_ms / 1000 + AFTER_EXPIRY_S)
            await asyncio.sleep(delay)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
