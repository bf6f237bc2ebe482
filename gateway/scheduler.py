"""The one gate: every admission-controlled request passes through the ``Scheduler``.

The scheduler drives a counter backend. ``free_seats`` (when the backend decides in
process) and ``try_acquire`` are the synchronous fast path for a request that finds a free
seat and nobody waiting; ``acquire`` is the full path: it waits for a grant without
polling, gives up on queue timeout or client disconnect, and counts rejections. A grant
that races with a timeout or a disconnect is never lost: the backend hands those seats to
the next waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

from gateway.core.tickets import Ticket
from gateway.errors import Disconnected, Rejected
from gateway.protocols import CounterBackend, Pending, Permit
from gateway.settings import Settings

#: Resolves to True when the client went away, False when it can no longer tell.
DisconnectWatch = Callable[[], Awaitable[bool]]

__all__ = ["DisconnectWatch", "Permit", "Scheduler"]


class Scheduler:
    """Admits requests through one counter backend; see the module docstring.

    ``admitted``, ``released`` and ``rejected`` count what happened, so that tests and
    operators can check that every permit handed out came back exactly once; seats taken
    from ``free_seats`` directly count as admitted when taken and released when given back.
    """

    def __init__(self, backend: CounterBackend, settings: Settings) -> None:
        self.backend = backend
        #: the backend's fast path (None when every grant needs I/O): ``take`` a free seat
        #: and ``give_back`` it without a Permit, for callers that release it themselves
        self.free_seats = backend.free_seats
        self._settings = settings
        self._timeout_s = settings.queue_timeout_s
        self._admitted = 0
        self._released = 0
        self.rejected: Counter[str] = Counter()

    @property
    def admitted(self) -> int:
        """Requests granted seats so far."""
        seats = self.free_seats
        return self._admitted + (seats.taken if seats is not None else 0)

    @property
    def released(self) -> int:
        """Grants whose seats came back so far."""
        seats = self.free_seats
        return self._released + (seats.given_back if seats is not None else 0)

    def try_acquire(self, ticket: Ticket) -> Permit | None:
        """A permit if seats are free now, nobody waits and the backend has started; else
        None (call ``acquire``)."""
        seats = self.free_seats
        if seats is None or not seats.take(ticket):
            return None
        return Permit(ticket, None, seats)

    async def acquire(
        self, ticket: Ticket, *, disconnected: DisconnectWatch | None = None
    ) -> Permit:
        """Seats for ``ticket``, now or after waiting its turn.

        Raises ``Rejected`` (the caller answers 503/429) or ``Disconnected`` (the client
        went away while waiting; nobody is left to answer).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            outcome = await self.backend.acquire(ticket)
            if isinstance(outcome, Pending):
                outcome = await self._wait(outcome, disconnected)
        except Rejected as exc:
            self.rejected[exc.reason] += 1
            raise
        # from the call on: in cluster mode a grant without a wait still took its round
        # trip to Redis, and a wait began only once Redis had answered that first call
        outcome.waited_s = loop.time() - started
        outcome.owner = self
        self._admitted += 1
        return outcome

    async def _wait(self, pending: Pending, disconnected: DisconnectWatch | None) -> Permit:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._timeout_s, self._expire, pending)
        watcher = None
        if disconnected is not None:
            watcher = loop.create_task(self._watch(pending, disconnected))
        try:
            permit = await pending.future
        except asyncio.CancelledError:
            # cancelled while waiting, or right after a grant reached us: either way the
            # backend takes the seats back
            self.backend.cancel(pending)
            raise
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
        return permit

    def _expire(self, pending: Pending) -> None:
        if pending.future.done():
            return  # the grant came first: the request runs
        self.backend.cancel(pending)
        if not pending.future.done():
            pending.future.set_exception(
                Rejected.because("queue_timeout", retry_after_s=self._settings.retry_after_s)
            )

    async def _watch(self, pending: Pending, disconnected: DisconnectWatch) -> None:
        with contextlib.suppress(Exception):
            if not await disconnected():
                return
            if not pending.future.done():
                self.backend.cancel(pending)
                if not pending.future.done():
                    pending.future.set_exception(Disconnected())

    def _release(self, permit: Permit) -> None:
        self._released += 1
        self.backend.release(permit)
