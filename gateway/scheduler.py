"""The one gate: every admission-controlled request passes through ``Scheduler.acquire``.

The scheduler drives a counter backend: it waits for a grant without polling, gives up on
queue timeout or client disconnect, and hands out permits that release exactly once.
A grant that races with a timeout or a disconnect is never lost: the backend hands those
seats to the next waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

from gateway.backends.memory import rejection
from gateway.core.permit import ReleaseOnce
from gateway.core.tickets import Ticket
from gateway.errors import Disconnected, Rejected
from gateway.protocols import CounterBackend, Lease, Pending
from gateway.settings import Settings

#: Resolves to True when the client went away, False when it can no longer tell.
DisconnectWatch = Callable[[], Awaitable[bool]]


class Permit:
    """Seats held by one admitted request. ``release()`` counts once, whoever calls it."""

    __slots__ = ("_backend", "_once", "_scheduler", "lease", "waited_s")

    def __init__(self, lease: Lease, scheduler: Scheduler, waited_s: float) -> None:
        self.lease = lease
        self.waited_s = waited_s
        self._scheduler = scheduler
        self._once = ReleaseOnce()

    @property
    def released(self) -> bool:
        return self._once.released

    def release(self) -> bool:
        """Give the seats back; True for the one call that did, False for any other."""
        if not self._once.claim():
            return False
        self._scheduler._release(self.lease)
        return True


class Scheduler:
    """Admits requests through one counter backend; see the module docstring."""

    def __init__(self, backend: CounterBackend, settings: Settings) -> None:
        self.backend = backend
        self._settings = settings
        self._timeout_s = settings.queue_timeout_s
        self.admitted = 0
        self.released = 0
        self.rejected: Counter[str] = Counter()

    async def acquire(
        self, ticket: Ticket, *, disconnected: DisconnectWatch | None = None
    ) -> Permit:
        """Seats for ``ticket``, now or after waiting its turn.

        Raises ``Rejected`` (the caller answers 503/429) or ``Disconnected`` (the client
        went away while waiting; nobody is left to answer).
        """
        try:
            outcome = await self.backend.acquire(ticket)
            if isinstance(outcome, Pending):
                return await self._wait(outcome, disconnected)
        except Rejected as exc:
            self.rejected[exc.reason] += 1
            raise
        self.admitted += 1
        return Permit(outcome, self, 0.0)

    async def _wait(self, pending: Pending, disconnected: DisconnectWatch | None) -> Permit:
        loop = asyncio.get_running_loop()
        started = loop.time()
        timer = loop.call_later(self._timeout_s, self._expire, pending)
        watcher = None
        if disconnected is not None:
            watcher = loop.create_task(self._watch(pending, disconnected))
        try:
            lease = await pending.future
        except asyncio.CancelledError:
            # cancelled while waiting, or right after a grant reached us: either way the
            # backend takes the seats back
            self.backend.cancel(pending)
            raise
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
        self.admitted += 1
        return Permit(lease, self, loop.time() - started)

    def _expire(self, pending: Pending) -> None:
        if pending.future.done():
            return  # the grant came first: the request runs
        self.backend.cancel(pending)
        if not pending.future.done():
            pending.future.set_exception(rejection("queue_timeout", self._settings))

    async def _watch(self, pending: Pending, disconnected: DisconnectWatch) -> None:
        with contextlib.suppress(Exception):
            if not await disconnected():
                return
            if not pending.future.done():
                self.backend.cancel(pending)
                if not pending.future.done():
                    pending.future.set_exception(Disconnected())

    def _release(self, lease: Lease) -> None:
        self.released += 1
        self.backend.release(lease)
