"""The Redis counter backend: one budget, one limit and one fair queue for every pod.

Seats are leases in Redis (see ``step.lua``); this pod keeps a table of the leases it
holds and the waiters it has queued, and talks to Redis through one coalescing caller:
while one call is in flight, everything else the pod has to say (acquires, releases,
cancels, the heartbeat, a new limit) gathers into the next call, so a lone request waits
for nothing and a busy pod pays one round trip for many requests.

Grants for this pod's waiters arrive on its own pub/sub channel; the heartbeat (every
third of the lease TTL, with jitter) renews the pod's leases, writes back the ones Redis
forgot, and picks up grants whose message was lost. When Redis cannot be reached within
``redis_retry_budget_s``, ``redis_failure_mode`` decides (see ``Fallback``); when it
answers again, the pod re-asserts what it holds and hands its local waiters back to the
shared queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal, get_args

import redis.exceptions
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from gateway.backends.redis.clock import RedisClock
from gateway.backends.redis.connect import Client, connect
from gateway.backends.redis.fallback import Fallback
from gateway.backends.redis.keys import PoolKeys, escape_tenant, new_pod_id, unescape_tenant
from gateway.backends.redis.script import StepScript
from gateway.backends.redis.telemetry import observe
from gateway.backends.redis.wire import (
    DEADLINE,
    PROBE,
    RETRIED,
    AcquireOp,
    Batch,
    Header,
    LateCall,
    News,
    Note,
    PodConfig,
    StepReply,
    encode,
    parse_notes,
)
from gateway.core.admission import OverflowAction
from gateway.core.tickets import NO_WAIT_RANK, Ticket
from gateway.errors import Rejected, RejectReason
from gateway.protocols import OverflowPolicy, Pending, Permit, Snapshot, TenantState
from gateway.settings import Settings, shown_url

log = logging.getLogger("obleth.cluster")

#: What counts as "Redis cannot be reached" (as opposed to a bug, which propagates).
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
#: What makes a call fail and be tried again within the retry budget: no connection, or
#: an error reply that another try may not get (OOM at maxmemory, READONLY from a replica
#: during a failover, a script killed as BUSY). Past the budget, the failure mode applies.
FAILED = (*UNREACHABLE, redis.exceptions.ResponseError)
#: In its failure mode a pod asks Redis this often (at most) whether it is back: the pods
#: that lost Redis together answer one roll call, and it closes only when all have.
RECOVERY_PROBE_S = 0.2
#: The longest a lost notification connection waits before it tries again.
RESUBSCRIBE_MAX_S = 0.2


class RedisUnavailable(Exception):
    """Redis did not answer within the retry budget."""


class _Op:
    """An acquire on its way to Redis: the caller awaits ``answered``."""

    __slots__ = ("answered", "op", "pending")

    def __init__(self, op: AcquireOp, pending: Pending, answered: asyncio.Future[None] | None):
        self.op = op
        self.pending = pending
        self.answered = answered


class RedisBackend:
    """Seats and the fair queue in Redis; see ``gateway.protocols.CounterBackend``.

    ``pod`` names this process in Redis (lease ids, its notification channel). What the
    caller may rely on beyond the Protocol: ``mode`` is ``"redis"`` or the failure mode in
    force; ``reasserted`` counts leases this pod had to write back (Redis forgot them, or
    they expired while the pod was paused or cut off); ``degraded_since`` is set while
    Redis is unreachable.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        limit: Callable[[], int],
        policy: OverflowPolicy,
        client: Client | None = None,
    ) -> None:
        assert settings.redis_url is not None
        #: every grant needs Redis: no fast path
        self.free_seats = None
        self._settings = settings
        self._limit = limit
        self._decide = policy.decide
        self.pod = new_pod_id()
        self._ids = itertools.count(1)
        self._keys = PoolKeys(settings.pool)
        ttl_s = settings.lease_ttl_s
        self._interval_s = ttl_s / 3
        self._interval_ms = self._interval_s * 1000
        learn_s = settings.learning_window_s
        if learn_s is None:
            learn_s = 2 * self._interval_s + settings.redis_retry_budget_s
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._learn_ms = round(learn_s * 1000)
        self._wait_ms = round((settings.queue_timeout_s + ttl_s) * 1000)
        self._budget_s = settings.redis_retry_budget_s
        self._client_given = client is not None
        #: how long a pod waits for one call before it gives up on it (and Redis must not
        #: run it any more: see DEADLINE)
        self._call_timeout_s = max(0.1, min(self._budget_s, ttl_s / 3))
        self._client: Client = client or connect(
            settings.redis_url,
            pool_size=settings.redis_pool_size + 1,
            timeout_s=self._call_timeout_s,
            setting=settings.label("redis_url"),
        )
        self._script = StepScript(self._client, self._keys)
        self._config = _pod_config(settings)

        # what this pod holds: leases by id, and its waiters (queued here or in Redis)
        self._held: dict[str, Ticket] = {}
        self._waiting: dict[str, Pending] = {}
        self._confirmed: set[str] = set()  # waiters Redis said it queued
        #: a waiter handed back to Redis after the failure mode under a new id: old → new
        self._renamed: dict[str, str] = {}
        #: waiters granted too long ago to trust, until Redis confirms their lease
        self._confirming: set[str] = set()

        # what this pod knows of the pool, for roll calls (see step.lua)
        self._clock = RedisClock()
        self._roster: dict[str, int] = {}  # live pods → liveness (Redis ms)
        self._mver = -1
        self._roll_wake: asyncio.TimerHandle | None = None
        self._recover_soon = asyncio.Event()

        # the coalescing caller; the first call announces this pod and what it holds
        self._batch = Batch(config=self._config, heartbeat=True, reassert=True)
        self._ops: list[_Op] = []
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self._subscribed = asyncio.Event()

        # what the last reply said about the pool
        self._seen_limit: int | None = None
        self._inflight = 0
        self._queued = 0
        self._live_pods = 1
        self._epoch: str | None = None
        self._seq = 0
        self.learning_ms = 0
        self.reasserted = 0
        self.calls = 0
        self.notes_received: Counter[str] = Counter()

        self._fallback: Fallback | None = None
        self.degraded_since: float | None = None
        self._view = _PoolView(self)
        observe(self)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to this pod's channel, then make the first call (config, heartbeat).

        If Redis cannot be reached, the pod starts anyway in its failure mode and keeps
        trying: an application must be able to start while Redis is down.
        """
        self._running = True
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._listen(), name="obleth-redis-notify"))
        self._tasks.append(loop.create_task(self._heartbeats(), name="obleth-redis-heartbeat"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._budget_s + 1):
                await self._subscribed.wait()
        self._kick()
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def stop(self) -> None:
        """Answer local waiters 503, send what is still owed to Redis, close the client."""
        self._running = False
        for pending in list(self._waiting.values()):
            self.cancel(pending)
            _fail(pending, self._reject("unavailable"))
        if self._fallback is None:
            self._batch.leave = True
            with contextlib.suppress(Exception):
                await self._flush_now(retry=False)
        if self._roll_wake is not None:
            self._roll_wake.cancel()
        for task in self._tasks:
            task.cancel()
        if self._flusher is not None:
            self._tasks.append(self._flusher)
            self._flusher.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        with contextlib.suppress(Exception):
            await self._script.aclose()
        if not self._client_given:
            with contextlib.suppress(Exception):
                await self._client.aclose()

    # -- the counter backend Protocol -----------------------------------------------------

    async def acquire(self, ticket: Ticket) -> Permit | Pending:
        if not self._running:
            # not started, or stopped: no flusher would ever send this call to Redis
            raise self._reject("unavailable")
        if self._fallback is not None:
            return self._fallback_acquire(ticket)
        if len(self._waiting) >= self._settings.max_queue + self._settings.redis_pool_size:
            # Redis is slow and requests pile up here: bound them rather than our memory
            raise self._reject("queue_full")
        loop = asyncio.get_running_loop()
        waiter_id = self._new_id()
        pending = Pending(ticket, loop.create_future(), waiter_id)
        answered: asyncio.Future[None] = loop.create_future()
        self._waiting[waiter_id] = pending
        self._send_acquire(pending, self._action_for(ticket), answered)
        try:
            await answered
        except RedisUnavailable:
            self._waiting.pop(waiter_id, None)
            if self._fallback is None:
                raise self._reject("unavailable") from None
            return self._fallback_acquire(ticket)
        except asyncio.CancelledError:
            # the request went away before Redis answered: whatever Redis decided is undone
            self.cancel(pending)
            raise
        future = pending.future
        if not future.done():
            return pending
        error = future.exception()
        if error is not None:
            raise error
        return future.result()

    def release(self, permit: Permit) -> None:
        lease = permit.token
        assert isinstance(lease, str)
        ticket = self._held.pop(lease, None)
        if ticket is None:
            return
        if self._fallback is not None:
            self._fallback.release(lease)
        self._batch.releases.append(lease)
        self._kick()

    def cancel(self, pending: Pending) -> None:
        future = pending.future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                self.release(future.result())  # the grant came first: its seats go back
            return
        waiter_id = str(pending.token)
        while waiter_id in self._renamed:  # queued again, perhaps more than once
            waiter_id = self._renamed.pop(waiter_id)
        if self._waiting.pop(waiter_id, None) is None:
            return
        self._confirmed.discard(waiter_id)
        self._confirming.discard(waiter_id)  # its cancel gives back the lease, if any
        if self._fallback is not None:
            self._fallback.forget(waiter_id)
        self._batch.cancels.append(waiter_id)
        self._kick()

    def limit_changed(self) -> None:
        """A capacity provider changed here: its value becomes the limit of the whole pool."""
        self._batch.set_limit = self._limit()
        self._kick()

    def snapshot(self) -> Snapshot:
        """The pool as of the last reply; tenants as this pod sees them (its own requests).

        ``cluster_snapshot`` reads every tenant of the pool from Redis.
        """
        tenants: dict[str, dict[str, Any]] = {}
        for ticket in self._held.values():
            entry = tenants.setdefault(ticket.tenant, {"inflight": 0, "queued": Counter()})
            entry["inflight"] += ticket.seats
        for pending in self._waiting.values():
            entry = tenants.setdefault(pending.ticket.tenant, {"inflight": 0, "queued": Counter()})
            entry["queued"][pending.ticket.priority] += 1
        return Snapshot(
            limit=self.limit,
            inflight=self._inflight,
            queued=self._queued,
            max_queue=self._settings.max_queue,
            tenants={
                tenant: TenantState(
                    inflight=entry["inflight"],
                    queued=dict(entry["queued"]),
                    weight=self._weight(tenant),
                )
                for tenant, entry in sorted(tenants.items())
            },
        )

    # -- what else callers may read -------------------------------------------------------

    async def settled(self) -> None:
        """Return once everything this pod had to tell Redis has been told and answered."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)

    @property
    def limit(self) -> int:
        """The pool's limit as Redis last said it (this pod's own value before that)."""
        return self._seen_limit if self._seen_limit is not None else self._limit()

    @property
    def pool_name(self) -> str:
        return self._settings.pool

    @property
    def local_share(self) -> int:
        """Seats this pod admits on its own while in ``local`` failure mode, else 0."""
        fallback = self._fallback
        return fallback.share if fallback is not None and fallback.mode == "local" else 0

    @property
    def mode(self) -> str:
        return "redis" if self._fallback is None else self._settings.redis_failure_mode

    @property
    def live_pods(self) -> int:
        return self._live_pods

    @property
    def held(self) -> int:
        """Leases this pod holds (seats of requests running here)."""
        return len(self._held)

    async def cluster_snapshot(self) -> Snapshot:
        """Every tenant of the pool, read from Redis (one round trip; not for the hot path)."""
        client = self._client
        keys = self._keys
        state, tin, tq = (
            {str(k): str(v) for k, v in found.items()}
            for found in await asyncio.gather(
                client.hgetall(keys.key("state")),
                client.hgetall(keys.key("tin")),
                client.hgetall(keys.key("tq")),
            )
        )
        tenants = sorted(set(tin) | set(tq))
        return Snapshot(
            limit=int(state.get("limit", self.limit)),
            inflight=int(state.get("inflight", 0)),
            queued=sum(int(v) for v in tq.values()),
            max_queue=self._settings.max_queue,
            tenants={
                unescape_tenant(t): TenantState(
                    inflight=int(tin.get(t, 0)),
                    queued={"queued": int(tq.get(t, 0))},
                    weight=self._weight(unescape_tenant(t)),
                )
                for t in tenants
            },
        )

    # -- talking to Redis -------------------------------------------------------------------

    def _send_acquire(
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
        )
        self._batch.acquires.append(op)
        self._ops.append(_Op(op, pending, answered))
        self._kick()

    def _kick(self) -> None:
        """Make sure a call will carry what was just added (now, or right after the current)."""
        if self._flusher is None and self._fallback is None and self._running:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._batch and self._fallback is None:
                await self._flush_now()
        finally:
            self._flusher = None

    async def _flush_now(self, *, retry: bool = True) -> None:
        batch, self._batch = self._batch, Batch()
        ops, self._ops = self._ops, []
        args = encode(self._header(batch), batch, *self._heartbeat_report(batch))
        try:
            reply = await self._call(args, retry=retry)
        except RedisUnavailable as exc:
            # the acquires gathered meanwhile will not be sent either
            stranded = ops + self._ops
            self._ops = []
            self._batch.acquires.clear()
            self._requeue(batch, stranded)
            self._degrade(exc, stranded)
            return
        self._apply(batch, ops, reply)

    async def _call(self, args: list[Any], *, retry: bool) -> StepReply:
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
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(left_s),
                wait=wait_random_exponential(multiplier=0.02, max=self._budget_s / 4),
                retry=retry_if_exception_type(FAILED),
                reraise=True,
            ):
                with attempt:
                    return await self._attempt(args)
        except FAILED as exc:
            raise RedisUnavailable(_failure(exc)) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, args: list[Any]) -> StepReply:
        """One try of one call, with a deadline past which Redis must not run it (this pod
        stops waiting then); every answer, a refusal as late included, tells the pod
        where Redis' clock is."""
        self.calls += 1
        sent_at = self._clock.sent()
        args[DEADLINE] = self._clock.deadline_ms(self._call_timeout_s)
        try:
            reply = await self._script(args)
        except LateCall as late:
            self._clock.observe(late.now_ms, sent_at)
            raise
        self._clock.observe(reply.now_ms, sent_at)
        return reply

    def _header(self, batch: Batch) -> Header:
        return Header(
            pod=self.pod,
            ttl_ms=self._ttl_ms,
            learn_ms=self._learn_ms,
            channel_prefix=self._keys.channel_prefix,
            init_limit=self.limit,
            max_queue=self._settings.max_queue,
            mver=self._mver,
            seen=None if self._epoch is None else (self._epoch, self._seq),
            # a failover or a restart shows as another run_id: looked at on heartbeats, on
            # a new connection, and (in _call) on every retry
            probe=batch.heartbeat or batch.recover or self._script.may_have_moved(),
        )

    def _heartbeat_report(
        self, batch: Batch
    ) -> tuple[list[tuple[str, str, int]], list[str], dict[str, int]]:
        if not batch.heartbeat:
            return [], [], {}
        leases = [(lid, escape_tenant(t.tenant), t.seats) for lid, t in self._held.items()]
        roster = {pod: alive for pod, alive in self._roster.items() if pod != self.pod}
        # a grant being confirmed is reported like a waiter: if its lease holds, the
        # heartbeat renews it and reports it missed, which runs it
        return leases, sorted(self._confirmed | self._confirming), roster

    def _requeue(self, batch: Batch, ops: list[_Op]) -> None:
        """Keep what Redis must still hear after a failed call: releases, cancels, the
        limit, and a cancel for every acquire it may have executed without answering."""
        later = self._batch
        later.releases[:0] = batch.releases
        later.cancels[:0] = batch.cancels + [entry.op.id for entry in ops]
        later.confirms[:0] = batch.confirms
        if later.set_limit is None:
            later.set_limit = batch.set_limit
        later.config = later.config or batch.config
        later.heartbeat = True
        later.reassert = later.reassert or batch.reassert
        later.leave = later.leave or batch.leave
        later.checked = later.checked or batch.checked

    def _apply(
        self, batch: Batch, ops: list[_Op], reply: StepReply, *, recovering: bool = False
    ) -> None:
        new_epoch = self._epoch is not None and reply.epoch != self._epoch
        if self._epoch is None or new_epoch:
            self._seq = 0
        self._epoch = reply.epoch
        self._seq = max(self._seq, reply.seq)
        self._seen_limit = reply.limit
        self._inflight = reply.inflight
        self._queued = reply.queued
        self._live_pods = max(1, reply.live_pods)
        self.learning_ms = reply.learning_ms
        self.reasserted += reply.reasserted
        if reply.roster is not None and reply.asserted:
            # kept until this pod has answered the roll call: after a loss Redis knows
            # fewer pods than this roster does, and the roll call needs them all
            self._roster = reply.roster
            self._mver = reply.mver
        if not reply.asserted:
            # a roll call is open (or this pod came back after its liveness passed): Redis
            # grants it nothing until it has re-asserted what it holds
            self._batch.heartbeat = True
            self._batch.reassert = True
        if reply.reasserted and not recovering:
            log.warning(
                "pod %s re-asserted %d lease(s) Redis no longer had (Redis lost state, or this "
                "pod was paused or cut off for longer than lease_ttl_s=%s)",
                self.pod,
                reply.reasserted,
                self._settings.lease_ttl_s,
            )

        # waiters Redis knew before this call: after a new epoch it has forgotten them
        known_before = sorted(self._confirmed) if new_epoch else []
        # the lease of a grant made (or renewed) by this call; read in time, as replies
        # nearly always are, it needs no check of its own
        granted_until: int | None = reply.now_ms + self._ttl_ms
        if self._clock.outlives(reply.now_ms + self._ttl_ms, self._interval_ms):
            granted_until = None
        for entry, answer in zip(ops, reply.answers, strict=True):
            self._settle(entry, answer, granted_until)
        for waiter_id, answer in zip(batch.confirms, reply.confirmed, strict=True):
            self._on_confirmation(waiter_id, answer == "y")
        for note in reply.notes:
            self._on_note(note)
        for waiter_id in reply.missed:
            self.notes_received["missed"] += 1  # found by the heartbeat, not by a message
            self._on_note(Note(waiter_id, expires=granted_until))  # the heartbeat renewed it

        if new_epoch:
            log.warning(
                "%s (new epoch %s): re-asserting %d lease(s) and %d waiter(s)",
                _EPOCH_CAUSES.get(reply.new_epoch, _EPOCH_CAUSES[""]).format(
                    pool=self._settings.pool
                ),
                reply.epoch,
                len(self._held),
                len(self._confirmed),
            )
            self._batch.config = self._config
            self._batch.heartbeat = True
            self._batch.checked = True
            for waiter_id in known_before:
                pending = self._waiting.get(waiter_id)
                if pending is not None:
                    self._confirmed.discard(waiter_id)
                    self._send_acquire(pending, "requeue", None)
        else:
            for waiter_id in reply.lost:
                if waiter_id in self._confirmed:
                    self._queue_again(waiter_id)
        if reply.learning_ms and self._waiting:
            self._call_back_in(reply.learning_ms / 1000)
        if self._batch:
            self._kick()

    def _settle(self, entry: _Op, answer: str, granted_until: int | None) -> None:
        """Apply Redis' answer to one acquire, then wake its caller."""
        waiter_id = entry.op.id
        pending = entry.pending
        if answer == "g":
            self._on_note(Note(waiter_id, expires=granted_until))
        elif answer == "q":
            if waiter_id in self._waiting:
                self._confirmed.add(waiter_id)
        else:
            if self._waiting.pop(waiter_id, None) is not None:
                _fail(pending, self._reject(_reason(answer)))
        if entry.answered is not None and not entry.answered.done():
            entry.answered.set_result(None)

    def _on_note(self, note: Note) -> None:
        """A grant or a drop for one of this pod's waiters, however it reached us."""
        self.notes_received["granted" if note.reason is None else note.reason] += 1
        if self._fallback is not None and self._fallback.waits(note.id):
            # adopted by the failure mode, and its cancel is on its way to Redis, which
            # then takes back whatever it granted: running the request on that lease
            # would run it on a seat Redis counts as free
            return
        if (
            note.reason is None
            and note.expires is not None
            and note.id in self._waiting
            and not self._clock.outlives(note.expires, self._interval_ms)
        ):
            # read too late to trust (this pod was frozen, or its loop held up): the lease
            # may have expired and its seat gone to another pod, so Redis confirms it first
            self.notes_received["stale"] += 1
            self._confirmed.discard(note.id)
            if note.id not in self._confirming:
                self._confirming.add(note.id)
                self._batch.confirms.append(note.id)
                self._kick()
            return
        pending = self._waiting.pop(note.id, None)
        self._confirmed.discard(note.id)
        self._confirming.discard(note.id)
        if note.reason is not None:
            if pending is not None:
                _fail(pending, self._reject(_reason(note.reason)))
            return
        if pending is None:
            if note.id not in self._held:
                # a grant nobody waits for any more (cancelled, or a call we gave up on)
                self._batch.releases.append(note.id)
                self._kick()
            return
        self._held[note.id] = pending.ticket
        if pending.future.done():
            self.release(Permit(pending.ticket, note.id))
        else:
            pending.future.set_result(Permit(pending.ticket, note.id))

    def _on_confirmation(self, waiter_id: str, holds: bool) -> None:
        """Redis' answer about a grant read too late: run it, or wait for a seat again."""
        if waiter_id not in self._confirming:
            if holds and waiter_id not in self._held:
                self._batch.releases.append(waiter_id)  # cancelled meanwhile
            return
        self._confirming.discard(waiter_id)
        if holds:
            self._on_note(Note(waiter_id))
        else:
            self.notes_received["stale_given_back"] += 1
            self._queue_again(waiter_id)

    def _queue_again(self, waiter_id: str) -> None:
        """Redis no longer has this waiter (it dropped it while the pod was away, or its
        grant expired unseen): it waits in the shared queue again, under a new id, past
        ``max_queue`` if need be. It is never answered ``evicted`` for it."""
        pending = self._waiting.get(waiter_id)
        self._confirmed.discard(waiter_id)
        if pending is None or pending.future.done():
            return
        self.notes_received["queued_again"] += 1
        self._batch.checked = True
        self._send_acquire(self._renew(pending), "requeue", None)

    def _on_news(self, news: News) -> None:
        """What the pod's channel said besides its waiters' notes."""
        if news.roll_call:
            if self._fallback is not None:
                self._recover_soon.set()
                return
            self._batch.heartbeat = True
            self._batch.reassert = True
        if news.membership:
            self._batch.ping = True
        self._kick()

    def _call_back_in(self, delay_s: float) -> None:
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
        self._batch.ping = True
        self._kick()

    # -- notifications and heartbeats -----------------------------------------------------

    async def _listen(self) -> None:
        """Read this pod's channel; after any reconnect, a heartbeat picks up what was missed.

        A lost subscription is tried again within ``RESUBSCRIBE_MAX_S``: after a Redis
        restart the pods' subscriptions are how a roll call knows who is live.
        """
        channel = self._keys.channel(self.pod)
        backoff = 0.02
        first = True
        while self._running:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(channel)
                self._subscribed.set()
                backoff = 0.02
                if not first:
                    if self._fallback is not None:
                        self._recover_soon.set()
                    self._batch.heartbeat = True
                    self._kick()
                first = False
                while self._running:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self._interval_s
                    )
                    if message is not None and message.get("type") == "message":
                        notes, news = _notes_of(message.get("data"))
                        for note in notes:
                            self._on_note(note)
                        if news.roll_call or news.membership:
                            self._on_news(news)
            except UNREACHABLE:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RESUBSCRIBE_MAX_S, self._interval_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _heartbeats(self) -> None:
        while self._running:
            if self._fallback is None:
                await asyncio.sleep(self._interval_s * random.uniform(0.8, 1.0))  # noqa: S311
            else:
                # in the failure mode: ask Redis often, and at once when it calls a roll
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self._interval_s, RECOVERY_PROBE_S)):
                        await self._recover_soon.wait()
            self._recover_soon.clear()
            if self._fallback is None:
                self._batch.heartbeat = True
                self._kick()
            else:
                await self._try_recover()

    # -- when Redis cannot be reached -----------------------------------------------------

    def _degrade(self, exc: RedisUnavailable, stranded: list[_Op]) -> None:
        """Enter the failure mode; ``stranded`` acquires got no answer from Redis."""
        if self._fallback is not None:
            return
        mode = self._settings.redis_failure_mode
        self._fallback = Fallback(
            self._settings,
            share=self._local_share(),
            decide=self._decide,
            held=self._held,
            waiting=self._waiting,
            new_id=self._new_id,
        )
        self.degraded_since = asyncio.get_running_loop().time()
        log.error(
            "Redis unreachable for pool %r at redis_url=%s (%s) after %.1fs of retries; "
            "failure mode %r: %s",
            self._settings.pool,
            shown_url(self._settings.redis_url or ""),
            exc,
            self._budget_s,
            mode,
            self._fallback.describe(),
        )
        # a grant waiting for Redis to confirm it is adopted like a queued waiter: its
        # cancel gives the lease back, if Redis still has it, when Redis answers again
        for waiter_id in sorted(self._confirming):
            self._confirmed.add(waiter_id)
        self._confirming.clear()
        self._batch.confirms.clear()
        # waiters queued in Redis can no longer hear of a grant: the failure mode takes them
        for waiter_id in sorted(self._confirmed):
            pending = self._waiting.get(waiter_id)
            if pending is None:
                continue
            self._confirmed.discard(waiter_id)
            self._batch.cancels.append(waiter_id)
            if not self._fallback.adopt(pending):
                self._waiting.pop(waiter_id, None)
        for entry in stranded:
            if entry.answered is not None:
                # the caller is still in acquire(): it asks the failure mode itself
                if not entry.answered.done():
                    entry.answered.set_exception(RedisUnavailable(str(exc)))
            elif entry.op.id in self._waiting and not self._fallback.adopt(entry.pending):
                self._waiting.pop(entry.op.id, None)

    def _fallback_acquire(self, ticket: Ticket) -> Permit | Pending:
        assert self._fallback is not None
        outcome = self._fallback.acquire(ticket)
        if isinstance(outcome, Pending):
            assert isinstance(outcome.token, str)
            self._waiting[outcome.token] = outcome
        return outcome

    async def _try_recover(self) -> None:
        # while unreachable this pod may have admitted seats Redis never counted, and so
        # may every pod that lost Redis with it: the call opens a roll call, and nothing
        # new is granted until each of them has re-asserted what it holds
        self._batch.heartbeat = True
        self._batch.reassert = True
        self._batch.recover = True
        self._batch.config = self._config
        fallback = self._fallback
        assert fallback is not None
        batch, self._batch = self._batch, Batch()
        args = encode(self._header(batch), batch, *self._heartbeat_report(batch))
        try:
            reply = await self._call(args, retry=False)
        except RedisUnavailable:
            self._requeue(batch, [])
            fallback.share = self._local_share()
            return
        # the reply is applied while the failure mode still holds its waiters: a grant it
        # carries for one of them is for a waiter this very call cancelled (see _on_note)
        self._apply(batch, [], reply, recovering=True)
        self._fallback = None
        self.degraded_since = None
        moved = fallback.close()
        log.warning(
            "Redis reachable again for pool %r: %d lease(s) re-asserted, %d local waiter(s) "
            "handed back to the shared queue",
            self._settings.pool,
            reply.reasserted,
            len(moved),
        )
        self._batch.checked = True
        for pending in moved:
            self._send_acquire(self._renew(pending), "requeue", None)
        self._kick()

    def _renew(self, pending: Pending) -> Pending:
        """``pending`` under a new waiter id, for the shared queue again: Redis was told
        to cancel its old one, and a grant of the old id still on its way must find no
        waiter (it is given back). The caller's ``pending`` keeps the old id, which
        ``cancel`` maps to the new one until the request is settled."""
        old = str(pending.token)
        renewed = Pending(pending.ticket, pending.future, self._new_id())
        self._waiting.pop(old, None)
        self._waiting[str(renewed.token)] = renewed
        self._renamed[old] = str(renewed.token)
        pending.future.add_done_callback(lambda _: self._renamed.pop(old, None))
        return renewed

    def _local_share(self) -> int:
        return self.limit // max(1, self._live_pods)

    # -- small helpers --------------------------------------------------------------------

    def _new_id(self) -> str:
        return f"{self.pod}.{next(self._ids)}"

    def _action_for(self, ticket: Ticket) -> OverflowAction:
        if ticket.rank >= NO_WAIT_RANK:
            return "reject"
        return self._decide(self._view, ticket)

    def _weight(self, tenant: str) -> float:
        return self._settings.tenant_weights.get(tenant, self._settings.default_tenant_weight)

    def _reject(self, reason: RejectReason) -> Rejected:
        return Rejected.because(reason, retry_after_s=self._settings.retry_after_s)


class _PoolView:
    """What an overflow policy sees in cluster mode: the pool's totals as of the last
    reply, and this pod's own requests per tenant (the pool's are in Redis)."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend

    @property
    def inflight(self) -> int:
        return self._backend._inflight

    @property
    def queued(self) -> int:
        return self._backend._queued

    @property
    def max_queue(self) -> int:
        return self._backend._settings.max_queue

    @property
    def queue_full(self) -> bool:
        return self.queued >= self.max_queue

    def tenant_inflight(self, tenant: str) -> int:
        return sum(t.seats for t in self._backend._held.values() if t.tenant == tenant)

    def tenant_queued(self, tenant: str) -> int:
        return sum(1 for p in self._backend._waiting.values() if p.ticket.tenant == tenant)

    def weight(self, tenant: str) -> float:
        return self._backend._weight(tenant)


_REASONS: frozenset[str] = frozenset(get_args(RejectReason))

#: What a pod logs when it finds a new epoch, by the cause the call gave.
_EPOCH_CAUSES = {
    "lost": "Redis lost pool {pool!r} (a restart without persistence, FLUSHALL, eviction)",
    "seq": "Redis pool {pool!r} went back in time: a failover lost writes",
    "runid": "Redis pool {pool!r} is served by another Redis server (a failover or a restart)",
    "": "Redis pool {pool!r} started a new epoch (another pod found it lost or rolled back)",
}


def _reason(answer: str) -> RejectReason:
    return answer if answer in _REASONS else "unavailable"  # type: ignore[return-value]


def _notes_of(data: object) -> tuple[list[Note], News]:
    if not isinstance(data, str):
        return [], News()
    return parse_notes(data.split())


def _fail(pending: Pending, error: Rejected) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)


def _pod_config(settings: Settings) -> PodConfig:
    per_tenant, default_cap = settings.tenant_caps()
    return PodConfig(
        default_weight=settings.default_tenant_weight,
        default_cap=default_cap,
        weights=[(escape_tenant(t), w) for t, w in sorted(settings.tenant_weights.items())],
        caps=[(escape_tenant(t), c) for t, c in sorted(per_tenant.items())],
    )


def _failure(exc: BaseException) -> str:
    """What went wrong with a call, for the log: Redis's own words for an error reply."""
    if isinstance(exc, redis.exceptions.ResponseError):
        return f"Redis answered with an error: {exc}"
    return str(exc) or type(exc).__name__
