"""The Redis counter backend: one budget, one limit and one fair queue for every pod.

Seats are leases in Redis (see ``step.lua``); this pod keeps a table of the leases it
holds and the waiters it has queued (``PodState``), and four roles share it:

- ``Caller`` (calls.py): one coalescing caller, so a lone request waits for nothing and
  a busy pod pays one round trip for many requests; its ``Replies`` (replies.py) apply
  each answer to the pod;
- ``Leases`` (leases.py): grants as they reach the pod, and the heartbeat (every third of
  the lease TTL, with jitter) that renews the pod's leases, writes back the ones Redis
  forgot, and picks up grants whose message was lost;
- ``PodChannel`` (channel.py): this pod's pub/sub channel, where its grants arrive;
- ``FailureMode`` (failure_mode.py): when Redis cannot be reached within
  ``redis_retry_budget_s``, ``redis_failure_mode`` decides (see ``Fallback``); when it
  answers again, the pod re-asserts what it holds and hands its local waiters back to
  the shared queue;
- ``Leadership`` (leadership.py): the leader lease (leader.py), when computed capacity
  providers are selected: the pod holding it sends their values, which every pod then
  uses (``PoolCapacity``); and the ceiling this pod sets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.backends.redis.calls import Caller, RedisUnavailable, call_timeout_s
from gateway.backends.redis.channel import PodChannel
from gateway.backends.redis.connect import Client, connect
from gateway.backends.redis.failure_mode import FailureMode
from gateway.backends.redis.keys import unescape_tenant
from gateway.backends.redis.leadership import Leadership
from gateway.backends.redis.leases import Leases
from gateway.backends.redis.pod import PodState, PoolView, fail
from gateway.backends.redis.pool_capacity import PoolCapacity
from gateway.backends.redis.rates import SharedRates
from gateway.backends.redis.script import StepScript
from gateway.backends.redis.wire import Batch
from gateway.core.admission import OverflowAction
from gateway.core.rates import RateRules
from gateway.core.tickets import NO_WAIT_RANK, Ticket
from gateway.protocols import OverflowPolicy, Pending, Permit, Snapshot, TenantState
from gateway.settings import Settings
from gateway.tasks import cancel_and_wait


class RedisBackend:
    """Seats and the fair queue in Redis; see ``gateway.protocols.CounterBackend``.

    ``pod`` names this process in Redis (lease ids, its notification channel). What the
    caller may rely on beyond the Protocol: ``mode`` is ``"redis"`` or the failure mode in
    force; ``reasserted`` counts leases this pod had to write back (Redis forgot them, or
    they expired while the pod was paused or cut off); ``degraded_since`` is set while
    Redis is unreachable; ``leader`` names the pod that computes the computed providers.

    ``limit`` is this pod's own limit (``Capacity.current``), ``capacity`` its providers
    as the pool sees them (the same ones ``Capacity`` holds).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        limit: Callable[[], int],
        capacity: PoolCapacity,
        policy: OverflowPolicy,
        client: Client | None = None,
    ) -> None:
        assert settings.redis_url is not None
        #: every grant needs Redis: no fast path
        self.free_seats = None
        self._settings = settings
        self._limit = limit
        self._decide = policy.decide
        self._state = state = PodState(settings, limit, capacity)
        self.pod = state.id
        self._client_given = client is not None
        self._client: Client = client or connect(
            settings.redis_url,
            pool_size=settings.redis_pool_size + 1,
            timeout_s=call_timeout_s(settings),
            setting=settings.label("redis_url"),
        )
        self._script = StepScript(self._client, state.keys)
        # the roles share ``state``; the caller is told last whom its replies speak to (the
        # leases, the failure mode), since both of them call it too
        self._caller = Caller(state, self._script)
        self._failure = FailureMode(state, self._caller, policy.decide)
        self._leases = Leases(state, self._caller, self._failure)
        self._caller.attach(self._leases, self._failure)
        self._channel = PodChannel(state, self._client, self._caller, self._leases, self._failure)
        self._tasks: list[asyncio.Task[None]] = []
        self._view = PoolView(state)
        self._rates: SharedRates | None = None
        #: the leader lease (with computed providers) and what this pod says of capacity
        self._leadership = Leadership(self._client, state, settings, self._caller.kick)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to this pod's channel, then make the first call (config, heartbeat).

        If Redis cannot be reached, the pod starts anyway in its failure mode and keeps
        trying: an application must be able to start while Redis is down.
        """
        state = self._state
        state.running = True
        loop = asyncio.get_running_loop()
        notify = loop.create_task(self._channel.listen(), name="obleth-redis-notify")
        heartbeat = loop.create_task(self._leases.heartbeats(), name="obleth-redis-heartbeat")
        self._tasks += [notify, heartbeat]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._settings.redis_retry_budget_s + 1):
                await self._channel.subscribed.wait()
        keep = await self._leadership.start(lambda: state.running)
        if keep is not None:
            self._tasks.append(keep)
        self._caller.kick()
        flusher = self._caller.flusher
        if flusher is not None:
            await asyncio.shield(flusher)

    async def stop(self) -> None:
        """Answer local waiters 503, send what is still owed to Redis, close the client."""
        state = self._state
        state.running = False
        for pending in list(state.waiting.values()):
            self.cancel(pending)
            fail(pending, state.reject("unavailable"))
        if state.fallback is None:
            state.batch.leave = True
            with contextlib.suppress(Exception):
                await self._caller.flush_now(retry=False)
        self._caller.cancel_call_back()
        flusher = self._caller.flusher
        if flusher is not None:
            self._tasks.append(flusher)
        stopping = (cancel_and_wait(task) for task in self._tasks)
        await asyncio.gather(*stopping, return_exceptions=True)
        self._tasks.clear()
        await self._leadership.resign()
        if self._rates is not None:  # the refunds of the requests just refused go first
            await self._rates.stop()
        with contextlib.suppress(Exception):
            await self._script.aclose()
        if not self._client_given:
            with contextlib.suppress(Exception):
                await self._client.aclose()

    def shared_rates(self, rules: RateRules) -> SharedRates:
        """The tenants' rate budgets, kept in this pool's Redis beside its seats (the
        gateway asks for them when ``tenant_rpm`` or ``tenant_tpm`` is set)."""
        self._rates = SharedRates(self._client, self._state, rules)
        return self._rates

    # -- the counter backend Protocol -----------------------------------------------------

    async def acquire(self, ticket: Ticket) -> Permit | Pending:
        state = self._state
        if not state.running:
            # not started, or stopped: no flusher would ever send this call to Redis
            raise state.reject("unavailable")
        if state.fallback is not None:
            return self._failure.acquire(ticket)
        action = self._action_for(ticket)
        # under block ("wait") a request is never refused for a full queue
        if action != "wait" and (
            len(state.waiting) >= self._settings.max_queue + self._settings.redis_pool_size
        ):
            # Redis is slow and requests pile up here: bound them rather than our memory
            # (a request that waits for room is bounded by queue_timeout_s instead)
            raise state.reject("queue_full")
        loop = asyncio.get_running_loop()
        waiter_id = state.new_id()
        pending = Pending(ticket, loop.create_future(), waiter_id)
        answered: asyncio.Future[None] = loop.create_future()
        state.waiting[waiter_id] = pending
        self._caller.send_acquire(pending, action, answered)
        try:
            await answered
        except RedisUnavailable:
            state.waiting.pop(waiter_id, None)
            if state.fallback is None:
                raise state.reject("unavailable") from None
            return self._failure.acquire(ticket)
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
        self._leases.release(lease)

    def cancel(self, pending: Pending) -> None:
        future = pending.future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                self.release(future.result())  # the grant came first: its seats go back
            return
        state = self._state
        waiter_id = str(pending.token)
        while waiter_id in state.renamed:  # queued again, perhaps more than once
            waiter_id = state.renamed.pop(waiter_id)
        if state.waiting.pop(waiter_id, None) is None:
            return
        state.confirmed.discard(waiter_id)
        state.confirming.discard(waiter_id)  # its cancel gives back the lease, if any
        if state.fallback is not None:
            state.fallback.forget(waiter_id)
        if self._caller.withdraw(waiter_id):
            return  # never sent: Redis has nothing to cancel
        state.batch.cancels.append(waiter_id)
        self._caller.kick()

    def limit_changed(self) -> None:
        """This pod's own limit changed. The pool's limit is Redis' (``PoolCapacity``
        sends what this pod has to say of it): only the failure mode's local share, taken
        from this pod's own limit, follows at once."""
        fallback = self._state.fallback
        if fallback is not None:
            fallback.reshare(self._failure.local_share())

    def snapshot(self) -> Snapshot:
        """The pool as of the last reply; tenants as this pod sees them (its own requests).

        ``cluster_snapshot`` reads every tenant of the pool from Redis.
        """
        state = self._state
        budget = self._settings.global_max_tokens_in_flight
        tenants: dict[str, dict[str, Any]] = {}
        for ticket in state.held.values():
            entry = tenants.setdefault(ticket.tenant, {"inflight": 0, "queued": Counter()})
            entry["inflight"] += ticket.seats
        for pending in state.waiting.values():
            entry = tenants.setdefault(pending.ticket.tenant, {"inflight": 0, "queued": Counter()})
            entry["queued"][pending.ticket.priority] += 1
        return Snapshot(
            limit=self.limit,
            inflight=state.inflight,
            queued=state.queued,
            max_queue=self._settings.max_queue,
            tenants={
                tenant: TenantState(
                    inflight=entry["inflight"],
                    queued=dict(entry["queued"]),
                    weight=state.weight(tenant),
                )
                for tenant, entry in sorted(tenants.items())
            },
            tokens_inflight=state.tokens_inflight if budget is not None else None,
            max_tokens=budget,
        )

    # -- what else callers may read -------------------------------------------------------

    async def settled(self) -> None:
        """Return once everything this pod had to tell Redis has been told and answered."""
        await self._caller.settled()

    @property
    def limit(self) -> int:
        """The pool's limit as Redis last said it (this pod's own value before that)."""
        return self._state.limit

    @property
    def pool_name(self) -> str:
        return self._settings.pool

    @property
    def leader(self) -> str | None:
        """The pod holding the leader lease, as this pod last asked (None: nobody, not yet
        asked, or no computed providers here)."""
        return self._leadership.holder

    @property
    def leading(self) -> bool:
        """Whether this pod holds the leader lease (its computed values are the pool's)."""
        return self._leadership.leading()

    @property
    def local_share(self) -> int:
        """Seats this pod admits on its own while in ``local`` failure mode, else 0."""
        fallback = self._state.fallback
        return fallback.share if fallback is not None and fallback.mode == "local" else 0

    @property
    def mode(self) -> str:
        return "redis" if self._state.fallback is None else self._settings.redis_failure_mode

    @property
    def live_pods(self) -> int:
        return self._state.live_pods

    @property
    def held(self) -> int:
        """Leases this pod holds (seats of requests running here)."""
        return len(self._state.held)

    @property
    def degraded_since(self) -> float | None:
        """When (event loop time) this pod entered its failure mode; None while in Redis."""
        return self._state.degraded_since

    @property
    def reasserted(self) -> int:
        return self._state.reasserted

    @property
    def learning_ms(self) -> int:
        """While a roll call is open, ms until it may close with nobody answering, as of
        the last reply (0: none is open)."""
        return self._state.learning_ms

    @property
    def calls(self) -> int:
        """Calls (tries included) this pod made to Redis."""
        return self._state.calls

    @property
    def notes_received(self) -> Counter[str]:
        """Grants and drops this pod heard of, by how (``granted``, ``missed``, ``stale``...)."""
        return self._state.notes_received

    async def cluster_snapshot(self) -> Snapshot:
        """Every tenant of the pool, read from Redis (one round trip; not for the hot path)."""
        client = self._client
        keys = self._state.keys
        found = await asyncio.gather(
            client.hgetall(keys.key("state")),
            client.hgetall(keys.key("tin")),
            client.hgetall(keys.key("tq")),
            client.hlen(keys.key("wmeta")),
            client.zcard(keys.key("lobby")),
        )
        state, tin, tq = ({str(k): str(v) for k, v in table.items()} for table in found[:3])
        waiters, in_lobby = int(found[3]), int(found[4])
        tenants = sorted(set(tin) | set(tq))
        budget = self._settings.global_max_tokens_in_flight
        return Snapshot(
            limit=int(state.get("limit", self.limit)),
            inflight=int(state.get("inflight", 0)),
            # the queue's own count, as snapshot() has it; a tenant's count below also
            # holds its waiters for room in the lobby
            queued=waiters - in_lobby,
            max_queue=self._settings.max_queue,
            tenants={
                unescape_tenant(t): TenantState(
                    inflight=int(tin.get(t, 0)),
                    queued={"queued": int(tq.get(t, 0))},
                    weight=self._state.weight(unescape_tenant(t)),
                )
                for t in tenants
            },
            tokens_inflight=int(state.get("tokens", 0)) if budget is not None else None,
            max_tokens=budget,
        )

    # -- what the tests reach into (tests/backends/test_redis_pool.py) ---------------------

    @property
    def _running(self) -> bool:
        return self._state.running

    @_running.setter
    def _running(self, running: bool) -> None:
        self._state.running = running

    @property
    def _waiting(self) -> dict[str, Pending]:
        return self._state.waiting

    @property
    def _batch(self) -> Batch:
        return self._state.batch

    def _kick(self) -> None:
        self._caller.kick()

    async def _heartbeats(self) -> None:
        await self._leases.heartbeats()

    # -- small helpers --------------------------------------------------------------------

    def _action_for(self, ticket: Ticket) -> OverflowAction:
        if ticket.rank >= NO_WAIT_RANK:
            return "reject"
        return self._decide(self._view, ticket)
