"""The coalescing caller: one step call in flight at a time, carrying all that gathered.

While one call is in flight, everything else the pod has to say (acquires, releases,
cancels, the heartbeat, a new limit) gathers into the next ``Batch``, so a lone request
waits for nothing and a busy pod pays one round trip for many requests. A call that
fails is retried with backoff within ``redis_retry_budget_s``; past it, the failure mode
takes over (``FailureMode.degrade``). Each reply goes to ``Replies`` (``replies.py``),
which updates what the pod knows of the pool and settles the waiters it speaks of.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import redis.exceptions
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from gateway.backends.redis.keys import escape_tenant
from gateway.backends.redis.pod import PodState
from gateway.backends.redis.replies import Replies
from gateway.backends.redis.script import StepScript
from gateway.backends.redis.wire import (
    DEADLINE,
    PROBE,
    RETRIED,
    AcquireOp,
    Batch,
    Header,
    LateCall,
    StepReply,
    encode,
)
from gateway.core.admission import OverflowAction
from gateway.protocols import Pending
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.backends.redis.failure_mode import FailureMode
    from gateway.backends.redis.leases import Leases

log = logging.getLogger("obleth.cluster")

#: What counts as "Redis cannot be reached" (as opposed to a bug, which propagates).
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
#: What makes a call fail and be tried again within the retry budget: no connection, or
#: an error reply that another try may not get (OOM at maxmemory, READONLY from a replica
#: during a failover, a script killed as BUSY). Past the budget, the failure mode applies.
FAILED = (*UNREACHABLE, redis.exceptions.ResponseError)


_T = TypeVar("_T")


class RedisUnavailable(Exception):
    """Redis did not answer within the retry budget."""


async def retry_within(left_s: float, budget_s: float, attempt: Callable[[], Awaitable[_T]]) -> _T:
    """``attempt()`` tried again on ``FAILED``, with jittered backoff (at most a quarter of
    the retry budget ``budget_s`` between tries), for ``left_s`` more seconds; raises the
    last failure."""
    async for retry in AsyncRetrying(
        stop=stop_after_delay(left_s),
        wait=wait_random_exponential(multiplier=0.02, max=budget_s / 4),
        retry=retry_if_exception_type(FAILED),
        reraise=True,
    ):
        with retry:
            return await attempt()
    raise AssertionError("unreachable")  # pragma: no cover


class SentAcquire:
    """An acquire on its way to Redis: the caller awaits ``answered``."""

    __slots__ = ("answered", "op", "pending")

    def __init__(self, op: AcquireOp, pending: Pending, answered: asyncio.Future[None] | None):
        self.op = op
        self.pending = pending
        self.answered = answered

    def wake(self) -> None:
        """Let a caller still waiting in ``acquire()`` go on: it reads its answer from
        ``pending`` (granted, failed, or still waiting)."""
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)


def call_timeout_s(settings: Settings) -> float:
    """How long a pod waits for one call before it gives up on it (and Redis must not run
    it any more: see DEADLINE)."""
    return max(0.1, min(settings.redis_retry_budget_s, settings.lease_ttl_s / 3))


class Caller:
    """Sends ``pod.batch`` to Redis, one call at a time, and has ``replies`` apply each
    reply.

    ``attach`` gives it the roles a reply speaks to (grants go to the leases, a call that
    cannot reach Redis to the failure mode); both also call back into the caller.
    """

    _failure: FailureMode

    def __init__(self, pod: PodState, script: StepScript) -> None:
        settings = pod.settings
        self._pod = pod
        self._script = script
        learn_s = settings.learning_window_s
        if learn_s is None:
            learn_s = 2 * pod.interval_s + settings.redis_retry_budget_s
        self._ttl_ms = max(1, round(settings.lease_ttl_s * 1000))
        self._learn_ms = round(learn_s * 1000)
        self._wait_ms = round((settings.queue_timeout_s + settings.lease_ttl_s) * 1000)
        self._budget_s = settings.redis_retry_budget_s
        self._call_timeout_s = call_timeout_s(settings)
        self._ops: list[SentAcquire] = []
        #: the task sending calls while there is something to say; None when idle
        self.flusher: asyncio.Task[None] | None = None

        self._roll_wake: asyncio.TimerHandle | None = None
        #: applies each reply; what this pod knows of the pool is kept there
        self.replies = Replies(pod, self, ttl_ms=self._ttl_ms)

    def attach(self, leases: Leases, failure: FailureMode) -> None:
        self.replies.attach(leases)
        self._failure = failure

    # -- gathering and kicking ------------------------------------------------------------

    def send_acquire(
        self,
        pending: Pending,
        action: OverflowAction | Literal["requeue"],
        answered: asyncio.Future[None] | None,
    ) -> None:
        ticket = pending.ticket
        assert isinstance(pending.token, str)
        op = AcquireOp(
            pending.token,
            escape_tenant(ticket.tenant),
            ticket.rank,
            ticket.seats,
            action,
            self._wait_ms,
            ticket.tokens,
        )
        self._pod.batch.acquires.append(op)
        self._ops.append(SentAcquire(op, pending, answered))
        self.kick()

    def withdraw(self, waiter_id: str) -> bool:
        """Take back the acquire of ``waiter_id`` if it is still waiting for a call;
        whether it was. A cancel sent in the same call would not find it: ``step.lua``
        runs a call's cancels before its acquires, and the acquire would then queue in
        Redis with no request behind it, holding room in the queue and the tenant's cap."""
        acquires = self._pod.batch.acquires
        for index, op in enumerate(acquires):
            if op.id == waiter_id:
                del acquires[index]
                kept = []
                for entry in self._ops:
                    if entry.op.id == waiter_id:
                        entry.wake()  # still in acquire() when ``stop`` cancels it
                    else:
                        kept.append(entry)
                self._ops = kept
                return True
        return False

    def kick(self) -> None:
        """Make sure a call will carry what was just added (now, or right after the current)."""
        pod = self._pod
        if self.flusher is None and pod.fallback is None and pod.running:
            self.flusher = asyncio.get_running_loop().create_task(self._flush())

    async def settled(self) -> None:
        """Return once everything this pod had to tell Redis has been told and answered."""
        while self.flusher is not None:
            await asyncio.shield(self.flusher)

    def call_back_in(self, delay_s: float) -> None:
        """Call Redis again after ``delay_s``: a roll call may close by then with nobody
        else calling (a pod presumed dead, its fallback deadline), and waiters here wait."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(delay_s, 0.005)
        if self._roll_wake is not None:
            if self._roll_wake.when() <= when:
                return
            self._roll_wake.cancel()
        self._roll_wake = loop.call_at(when, self._ping)

    def _ping(self) -> None:
        self._roll_wake = None
        self._pod.batch.ping = True
        self.kick()

    def cancel_call_back(self) -> None:
        if self._roll_wake is not None:
            self._roll_wake.cancel()

    # -- sending ----------------------------------------------------------------------------

    async def _flush(self) -> None:
        try:
            while self._pod.batch and self._pod.fallback is None:
                await self.flush_now()
        finally:
            self.flusher = None

    async def flush_now(self, *, retry: bool = True) -> None:
        pod = self._pod
        batch, pod.batch = pod.batch, Batch()
        ops, self._ops = self._ops, []
        args = self.args_for(batch)
        try:
            reply = await self.call(args, retry=retry)
        except asyncio.CancelledError:
            # stop() cancels a call under way: its callers, still in acquire(), read their
            # answer from the pending (stop fails every one of them 503)
            for entry in ops:
                entry.wake()
            raise
        except RedisUnavailable as exc:
            # the acquires gathered meanwhile will not be sent either
            stranded = ops + self._ops
            self._ops = []
            pod.batch.acquires.clear()
            self.requeue(batch, stranded)
            self._failure.degrade(exc, stranded)
            return
        self.replies.apply(batch, ops, reply)

    async def call(self, args: list[Any], *, retry: bool) -> StepReply:
        """One call; on a connection error or an error reply (``FAILED``), retries with
        backoff within the budget (counted from the first try, which may itself have
        waited a whole timeout for a frozen Redis), then raises ``RedisUnavailable``."""
        started = time.monotonic()
        try:
            return await self._attempt(args)
        except FAILED as exc:
            left_s = self._budget_s - (time.monotonic() - started)
            if not retry or left_s <= 0:
                raise RedisUnavailable(_failure(exc)) from exc
        # the call may have run, or run in part before an error reply: acquires check
        # whether they did; and the server answering now may not be the one that did
        args[RETRIED] = 1
        args[PROBE] = 1
        try:
            return await retry_within(left_s, self._budget_s, lambda: self._attempt(args))
        except FAILED as exc:
            raise RedisUnavailable(_failure(exc)) from exc

    async def _attempt(self, args: list[Any]) -> StepReply:
        """One try of one call, with a deadline past which Redis must not run it (this pod
        stops waiting then); every answer, a refusal as late included, tells the pod
        where Redis' clock is."""
        clock = self._pod.clock
        self._pod.calls += 1
        sent_at = clock.sent()
        args[DEADLINE] = clock.deadline_ms(self._call_timeout_s)
        try:
            reply = await self._script(args)
        except LateCall as late:
            clock.observe(late.now_ms, sent_at)
            raise
        clock.observe(reply.now_ms, sent_at)
        return reply

    def args_for(self, batch: Batch) -> list[Any]:
        """ARGV for one call carrying ``batch``. The pod that holds the leader lease sends
        its computed values with every heartbeat (re-assertions included), so that Redis
        has them back as soon as it has its leases back, and knows they are current."""
        capacity = self._pod.capacity
        if batch.heartbeat and batch.computed is None and capacity.leading():
            batch.computed = capacity.own_values() or None
        return encode(self._header(batch), batch, *self._heartbeat_report(batch))

    def _header(self, batch: Batch) -> Header:
        pod = self._pod
        return Header(
            pod=pod.id,
            ttl_ms=self._ttl_ms,
            learn_ms=self._learn_ms,
            channel_prefix=pod.keys.channel_prefix,
            init_ceiling=pod.capacity.ceiling(),
            max_queue=pod.settings.max_queue,
            mver=self.replies.mver,
            seen=self.replies.seen,
            # a failover or a restart shows as another run_id: looked at on heartbeats, on
            # a new connection, and (in call) on every retry
            probe=batch.heartbeat or batch.recover or self._script.may_have_moved(),
            cver=pod.capacity.cver,
        )

    def _heartbeat_report(
        self, batch: Batch
    ) -> tuple[list[tuple[str, str, int, int]], list[str], dict[str, int]]:
        if not batch.heartbeat:
            return [], [], {}
        pod = self._pod
        leases = [(lid, escape_tenant(t.tenant), t.seats, t.tokens) for lid, t in pod.held.items()]
        roster = {other: alive for other, alive in self.replies.roster.items() if other != pod.id}
        # a grant being confirmed is reported like a waiter: if its lease holds, the
        # heartbeat renews it and reports it missed, which runs it
        return leases, sorted(pod.confirmed | pod.confirming), roster

    def requeue(self, batch: Batch, ops: list[SentAcquire]) -> None:
        """Keep what Redis must still hear after a failed call: releases, cancels, the
        ceiling, and a cancel for every acquire it may have executed without answering."""
        later = self._pod.batch
        later.releases[:0] = batch.releases
        later.cancels[:0] = batch.cancels + [entry.op.id for entry in ops]
        later.confirms[:0] = batch.confirms
        if later.ceiling is None:
            later.ceiling = batch.ceiling
        if later.computed is None:
            later.computed = batch.computed
        later.config = later.config or batch.config
        later.heartbeat = True
        later.reassert = later.reassert or batch.reassert
        later.leave = later.leave or batch.leave
        later.checked = later.checked or batch.checked


def _failure(exc: BaseException) -> str:
    """What went wrong with a call, for the log: Redis's own words for an error reply."""
    if isinstance(exc, redis.exceptions.ResponseError):
        return f"Redis answered with an error: {exc}"
    return str(exc) or type(exc).__name__
