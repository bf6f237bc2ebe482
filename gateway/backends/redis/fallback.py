"""What a pod does while Redis cannot be reached: ``redis_failure_mode``.

- ``closed``: new requests are answered 503 ``unavailable``; running ones go on.
- ``open``: every request is admitted (no limit at all until Redis answers).
- ``local``: this pod admits up to ``floor(limit / live pods)`` seats (the pod count as
  Redis last reported it; the limit this pod's own: the pool's ceiling as last heard and
  its own computed values), counting the seats it already held, with the same fair queue
  as the in-process backend. It is not a global guarantee: a pod that cannot see Redis
  cannot know what the others do.

Every permit handed out here gets a lease id of its own and joins the pod's held leases,
so the first heartbeat after recovery writes them into Redis and the shared budget
accounts for them; local waiters are handed back to the shared queue then (``close``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.backends.memory import fair_queue_for
from gateway.core.admission import Granted, OverflowAction, Queued, QueueView, admit, dispatch
from gateway.core.fairqueue import Waiter
from gateway.core.tickets import Ticket
from gateway.errors import Rejected, RejectReason
from gateway.protocols import Pending, Permit
from gateway.settings import Settings


class Fallback:
    """Admission while Redis is unreachable, in the configured failure mode.

    ``held`` and ``waiting`` are the backend's own tables (lease id → ticket, waiter id →
    pending): the fallback adds its grants to the first and removes what it settles from
    the second.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        share: int,
        pods: int = 1,
        decide: Callable[[QueueView, Ticket], OverflowAction],
        held: dict[str, Ticket],
        waiting: dict[str, Pending],
        new_id: Callable[[], str],
    ) -> None:
        self.mode = settings.redis_failure_mode
        self.share = share
        self._settings = settings
        self._decide = decide
        self._held = held
        self._waiting = waiting
        self._new_id = new_id
        self._queue = fair_queue_for(settings)
        budget = settings.global_max_tokens_in_flight
        if budget is not None:
            # the token budget is shared as the seats are: this pod's part of the pool's
            self._queue.max_tokens = max(1, budget // pods)
        self._waiters: dict[str, Waiter] = {}
        # seats this pod holds, counted against its local share
        self._counted: dict[str, Ticket] = {}
        if self.mode == "local":
            for lease, ticket in held.items():
                self._queue.grant(ticket)
                self._counted[lease] = ticket

    def describe(self) -> str:
        if self.mode == "closed":
            return "new requests are answered 503 until Redis answers again"
        if self.mode == "open":
            return "every request is admitted until Redis answers again (no limit)"
        tokens = self._queue.max_tokens
        return (
            f"admitting up to {self.share} request(s)"
            + ("" if tokens is None else f" and {tokens} tokens")
            + " on this pod (limit / live pods last seen); this is not a cluster-wide guarantee"
        )

    def acquire(self, ticket: Ticket) -> Permit | Pending:
        if self.mode == "closed":
            raise self._reject("unavailable")
        if self.mode == "open":
            return self._grant(ticket)
        loop = asyncio.get_running_loop()
        verdict = admit(self._queue, ticket, self.share, self._decide, now=loop.time())
        if isinstance(verdict, Granted):
            permit = self._grant(ticket, counted=True)
            if self._queue.queued:  # another head may be first in line now (memory.py)
                self._dispatch()
            return permit
        if isinstance(verdict, Queued):
            pending = Pending(ticket, loop.create_future(), self._new_id())
            self._file(verdict.waiter, pending)
            if verdict.evicted is not None:
                self._drop(verdict.evicted, "evicted")
            return pending
        raise self._reject(verdict.reason)

    def adopt(self, pending: Pending) -> bool:
        """Take over a waiter Redis had queued; True while it still waits (here)."""
        if self.mode == "closed":
            _fail(pending, self._reject("unavailable"))
            return False
        if self.mode == "open":
            _grant_to(pending, self._grant(pending.ticket))
            return False
        ticket = pending.ticket
        if self._queue.can_grant_now(ticket, self.share):
            self._queue.grant(ticket)
            _grant_to(pending, self._grant(ticket, counted=True))
            return False
        waiter = self._queue.enqueue(ticket, asyncio.get_running_loop().time())
        self._file(waiter, pending)
        return True

    def reshare(self, share: int) -> None:
        """The pod's limit changed: admit up to ``share`` from now on; a raise admits
        local waiters at once, a cut revokes nothing."""
        self.share = share
        if self.mode == "local":
            self._dispatch()

    def waits(self, waiter_id: str) -> bool:
        """Whether ``waiter_id`` waits in the local queue."""
        return waiter_id in self._waiters

    def release(self, lease: str) -> None:
        ticket = self._counted.pop(lease, None)
        if ticket is None:
            return
        self._queue.release(ticket)
        self._dispatch()

    def forget(self, waiter_id: str) -> None:
        """A local waiter gave up (timeout, disconnect)."""
        waiter = self._waiters.pop(waiter_id, None)
        if waiter is not None:
            self._queue.remove(waiter)

    def close(self) -> list[Pending]:
        """Redis is back: the local waiters, still waiting, for the shared queue."""
        moved = []
        for waiter_id, waiter in list(self._waiters.items()):
            self._queue.remove(waiter)
            pending = self._waiting.get(waiter_id)
            if pending is not None and not pending.future.done():
                moved.append(pending)
        self._waiters.clear()
        return moved

    # -- bookkeeping ----------------------------------------------------------------------

    def _grant(self, ticket: Ticket, *, counted: bool = False) -> Permit:
        # a lease id of its own, never an adopted waiter's: Redis is told to cancel that
        # one, and must not take the lease away when it does
        lease = self._new_id()
        self._held[lease] = ticket
        if counted:
            self._counted[lease] = ticket
        return Permit(ticket, lease)

    def _file(self, waiter: Waiter, pending: Pending) -> None:
        waiter_id = str(pending.token)
        waiter.handle = pending
        self._waiters[waiter_id] = waiter
        self._waiting[waiter_id] = pending

    def _drop(self, waiter: Waiter, reason: RejectReason) -> None:
        pending = waiter.handle
        assert isinstance(pending, Pending)
        waiter_id = str(pending.token)
        self._waiters.pop(waiter_id, None)
        self._waiting.pop(waiter_id, None)
        _fail(pending, self._reject(reason))

    def _dispatch(self) -> None:
        handed_back = True
        while handed_back:
            handed_back = False
            for waiter in dispatch(self._queue, self.share):
                pending = waiter.handle
                assert isinstance(pending, Pending)
                waiter_id = str(pending.token)
                self._waiters.pop(waiter_id, None)
                self._waiting.pop(waiter_id, None)
                if pending.future.done():
                    self._queue.release(waiter.ticket)  # nobody left to run it: next one
                    handed_back = True
                    continue
                _grant_to(pending, self._grant(waiter.ticket, counted=True))

    def _reject(self, reason: RejectReason) -> Rejected:
        return Rejected.because(reason, retry_after_s=self._settings.retry_after_s)


def _grant_to(pending: Pending, permit: Permit) -> None:
    if not pending.future.done():
        pending.future.set_result(permit)


def _fail(pending: Pending, error: Rejected) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)
