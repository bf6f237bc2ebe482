"""This pod's side of the pool: what it holds, what waits here, what it last heard.

The roles of the Redis backend (the caller, the leases and heartbeat, the failure mode,
the notification channel) share one ``PodState``: each reads and writes these tables and
none keeps a copy of its own, so a waiter or a lease is in exactly one place.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import get_args

from gateway.backends.redis.clock import RedisClock
from gateway.backends.redis.fallback import Fallback
from gateway.backends.redis.keys import PoolKeys, escape_tenant, new_pod_id
from gateway.backends.redis.pool_capacity import PoolCapacity
from gateway.backends.redis.wire import Batch, PodConfig
from gateway.core.tickets import Ticket
from gateway.errors import Rejected, RejectReason
from gateway.protocols import Pending
from gateway.settings import Settings


class PodState:
    """What the roles of one ``RedisBackend`` share.

    ``id`` names this process in Redis (lease ids, its notification channel). ``batch`` is
    what the next call will tell Redis: any role adds to it, then asks the caller to kick.
    ``limit`` is this pod's own limit (``Capacity.current``); ``capacity`` its providers
    as the pool sees them.
    """

    def __init__(
        self, settings: Settings, limit: Callable[[], int], capacity: PoolCapacity
    ) -> None:
        self.settings = settings
        self._limit = limit
        self.capacity = capacity
        self.id = new_pod_id()
        self._ids = itertools.count(1)
        self.keys = PoolKeys(settings.pool)
        self.config = _pod_config(settings)
        #: the heartbeat's period: a third of the lease TTL
        self.interval_s = settings.lease_ttl_s / 3
        self.interval_ms = self.interval_s * 1000
        #: False before start and after stop: nothing more is sent, the loops end
        self.running = False
        self.clock = RedisClock()

        # what this pod holds: leases by id, and its waiters (queued here or in Redis)
        self.held: dict[str, Ticket] = {}
        self.waiting: dict[str, Pending] = {}
        self.confirmed: set[str] = set()  # waiters Redis said it queued
        #: a waiter handed back to Redis after the failure mode under a new id: old → new
        self.renamed: dict[str, str] = {}
        #: waiters granted too long ago to trust, until Redis confirms their lease
        self.confirming: set[str] = set()

        # the first call announces this pod and what it holds
        self.batch = Batch(config=self.config, heartbeat=True, reassert=True)

        # what the last reply said about the pool
        self.seen_limit: int | None = None
        self.inflight = 0
        self.tokens_inflight = 0
        self.queued = 0
        self.live_pods = 1
        self.learning_ms = 0
        self.reasserted = 0
        self.calls = 0
        self.notes_received: Counter[str] = Counter()

        #: set while Redis is unreachable: admission in ``redis_failure_mode``
        self.fallback: Fallback | None = None
        self.degraded_since: float | None = None

    @property
    def limit(self) -> int:
        """The pool's limit as Redis last said it; this pod's own before that, and while
        Redis cannot be reached (its ceiling as last heard, its own computed values)."""
        if self.seen_limit is None or self.fallback is not None:
            return self._limit()
        return self.seen_limit

    def queued_in_redis(self) -> list[str]:
        """The waiters Redis said it queued, in the order they joined this pod's queue
        (their ids' order is not it: ``pod.10`` sorts before ``pod.2``). Handed back to
        Redis or to the failure mode in this order, a tenant's waiters stay first come,
        first served."""
        confirmed = self.confirmed
        return [waiter_id for waiter_id in self.waiting if waiter_id in confirmed]

    def new_id(self) -> str:
        return f"{self.id}.{next(self._ids)}"

    def renew(self, pending: Pending) -> Pending:
        """``pending`` under a new waiter id, for the shared queue again: Redis was told
        to cancel its old one, and a grant of the old id still on its way must find no
        waiter (it is given back). The caller's ``pending`` keeps the old id, which
        ``cancel`` maps to the new one until the request is settled."""
        old = str(pending.token)
        renewed = Pending(pending.ticket, pending.future, self.new_id())
        self.waiting.pop(old, None)
        self.waiting[str(renewed.token)] = renewed
        self.renamed[old] = str(renewed.token)
        pending.future.add_done_callback(lambda _: self.renamed.pop(old, None))
        return renewed

    def weight(self, tenant: str) -> float:
        return self.settings.tenant_weights.get(tenant, self.settings.default_tenant_weight)

    def reject(self, reason: RejectReason) -> Rejected:
        return Rejected.because(reason, retry_after_s=self.settings.retry_after_s)


class PoolView:
    """What an overflow policy sees in cluster mode: the pool's totals as of the last
    reply, and this pod's own requests per tenant (the pool's are in Redis)."""

    def __init__(self, pod: PodState) -> None:
        self._pod = pod

    @property
    def inflight(self) -> int:
        return self._pod.inflight

    @property
    def queued(self) -> int:
        return self._pod.queued

    @property
    def max_queue(self) -> int:
        return self._pod.settings.max_queue

    @property
    def queue_full(self) -> bool:
        return self.queued >= self.max_queue

    def tenant_inflight(self, tenant: str) -> int:
        return sum(t.seats for t in self._pod.held.values() if t.tenant == tenant)

    def tenant_queued(self, tenant: str) -> int:
        return sum(1 for p in self._pod.waiting.values() if p.ticket.tenant == tenant)

    def weight(self, tenant: str) -> float:
        return self._pod.weight(tenant)


_REASONS: frozenset[str] = frozenset(get_args(RejectReason))


def reason_of(answer: str) -> RejectReason:
    """The reject reason in Redis' answer (``unavailable`` for one this pod does not know)."""
    return answer if answer in _REASONS else "unavailable"  # type: ignore[return-value]


def fail(pending: Pending, error: Rejected) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)


def _pod_config(settings: Settings) -> PodConfig:
    per_tenant, default_cap = settings.tenant_caps()
    return PodConfig(
        default_weight=settings.default_tenant_weight,
        default_cap=default_cap,
        weights=[(escape_tenant(t), w) for t, w in sorted(settings.tenant_weights.items())],
        caps=[(escape_tenant(t), c) for t, c in sorted(per_tenant.items())],
        max_tokens=settings.global_max_tokens_in_flight,
        fair_by_tokens=settings.fairness_cost == "tokens",
    )
