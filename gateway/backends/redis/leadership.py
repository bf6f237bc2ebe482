"""``Leadership``: this pod's part in the pool's computed capacity.

When computed capacity providers are selected, the pod asks for the leader lease
(``leader.py``) and, while it holds it, sends its computed values with its calls; every
pod sends the operator's ceiling when it changes here. Both ride the coalesced calls of
``Caller`` (the batch's ``ceiling`` and ``computed``): nothing here writes to Redis but
the lease itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gateway.backends.redis.calls import FAILED, call_timeout_s
from gateway.backends.redis.connect import Client
from gateway.backends.redis.leader import LeaderLease
from gateway.backends.redis.pod import PodState
from gateway.settings import Settings


class Leadership:
    """Wires ``PodState.capacity`` (``PoolCapacity``) to the lease and the calls.

    ``lease`` is None on a pod without computed providers: it never asks for the lease and
    never leads, but still sends its ceiling.
    """

    def __init__(
        self, client: Client, state: PodState, settings: Settings, kick: Callable[[], None]
    ) -> None:
        self._state = state
        self._settings = settings
        self._kick = kick
        capacity = state.capacity
        self.lease: LeaderLease | None = None
        if capacity.computed:
            self.lease = LeaderLease(
                client,
                state.keys,
                state.id,
                ttl_s=settings.lease_ttl_s,
                on_gained=self.send_computed,
            )
            capacity.leading = self.lease.leading
        capacity.ceiling_set = self.send_ceiling
        capacity.own_changed = self.send_computed

    async def start(self, running: Callable[[], bool]) -> asyncio.Task[None] | None:
        """Ask for the lease once, before the pod's first call (which then carries the
        computed values if this pod leads); returns the task that keeps asking at the
        heartbeat's pace while ``running()``, None without computed providers."""
        lease = self.lease
        if lease is None:
            return None
        with contextlib.suppress(*FAILED, TimeoutError):
            async with asyncio.timeout(call_timeout_s(self._settings)):
                await lease.hold()
        return asyncio.get_running_loop().create_task(lease.keep(running), name="obleth-leader")

    async def resign(self) -> None:
        """Give the lease up if this pod holds it: another pod takes over at its next try
        rather than a TTL from now. Never raises."""
        if self.lease is not None and self.lease.leading():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(call_timeout_s(self._settings)):
                    await self.lease.resign()

    @property
    def holder(self) -> str | None:
        """The pod holding the lease, as this pod last asked (None: nobody, not yet asked,
        or no computed providers here)."""
        return self.lease.holder if self.lease is not None else None

    def leading(self) -> bool:
        """Whether this pod holds the lease (its computed values are the pool's)."""
        return self.lease is not None and self.lease.leading()

    def send_ceiling(self, ceiling: int) -> None:
        """The operator's limit changed on this pod: it becomes the pool's ceiling."""
        self._state.batch.ceiling = ceiling
        self._kick()

    def send_computed(self) -> None:
        """A computed value changed here, or this pod took the lease: if it leads, its
        values become the pool's."""
        if self.leading():
            self._state.batch.computed = self._state.capacity.own_values() or None
            self._kick()
