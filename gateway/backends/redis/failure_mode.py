"""Switching into and out of ``redis_failure_mode`` when Redis cannot be reached.

Past ``redis_retry_budget_s`` the pod admits on its own (``Fallback``), and waiters Redis
had queued for it move to the local queue. It then asks Redis often whether it is back;
when it is, the pod re-asserts what it holds (its recovery call opens a roll call, or
joins the one open), hands its local waiters back to the shared queue, and sends the
releases and cancels it owed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gateway.backends.redis.calls import Caller, RedisUnavailable, SentAcquire
from gateway.backends.redis.fallback import Fallback
from gateway.backends.redis.pod import PodState
from gateway.backends.redis.wire import Batch
from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.protocols import Pending, Permit
from gateway.settings import shown_url

log = logging.getLogger("obleth.cluster")

#: In its failure mode a pod asks Redis this often (at most) whether it is back: the pods
#: that lost Redis together answer one roll call, and it closes only when all have.
RECOVERY_PROBE_S = 0.2


class FailureMode:
    """Enters the failure mode (``degrade``), admits in it, and leaves it (``try_recover``).

    ``pod.fallback`` is set exactly while the failure mode is in force.
    """

    def __init__(
        self,
        pod: PodState,
        caller: Caller,
        decide: Callable[[QueueView, Ticket], OverflowAction],
    ) -> None:
        self._pod = pod
        self._caller = caller
        self._decide = decide
        #: set to probe Redis at once: it called a roll call, or the channel reconnected
        self.probe_now = asyncio.Event()

    def degrade(self, exc: RedisUnavailable, stranded: list[SentAcquire]) -> None:
        """Enter the failure mode; ``stranded`` acquires got no answer from Redis."""
        pod = self._pod
        if pod.fallback is not None:
            return
        settings = pod.settings
        fallback = pod.fallback = Fallback(
            settings,
            share=self.local_share(),
            pods=max(1, pod.live_pods),
            decide=self._decide,
            held=pod.held,
            waiting=pod.waiting,
            new_id=pod.new_id,
        )
        pod.degraded_since = asyncio.get_running_loop().time()
        # computed providers answer for themselves now: the pod cannot hear the pool's
        # values, and its share follows its own limit (``limit_changed``, each probe)
        pod.capacity.set_degraded(True)
        fallback.reshare(self.local_share())
        log.error(
            "Redis unreachable for pool %r at redis_url=%s (%s) after %.1fs of retries; "
            "failure mode %r: %s",
            settings.pool,
            shown_url(settings.redis_url or ""),
            exc,
            settings.redis_retry_budget_s,
            settings.redis_failure_mode,
            fallback.describe(),
        )
        # a grant waiting for Redis to confirm it is adopted like a queued waiter: its
        # cancel gives the lease back, if Redis still has it, when Redis answers again
        for waiter_id in sorted(pod.confirming):
            pod.confirmed.add(waiter_id)
        pod.confirming.clear()
        pod.batch.confirms.clear()
        # waiters queued in Redis can no longer hear of a grant: the failure mode takes them
        for waiter_id in pod.queued_in_redis():
            pending = pod.waiting[waiter_id]
            pod.confirmed.discard(waiter_id)
            pod.batch.cancels.append(waiter_id)
            if not fallback.adopt(pending):
                pod.waiting.pop(waiter_id, None)
        for entry in stranded:
            if entry.answered is not None:
                # the caller is still in acquire(): it asks the failure mode itself
                if not entry.answered.done():
                    entry.answered.set_exception(RedisUnavailable(str(exc)))
            elif entry.op.id in pod.waiting and not fallback.adopt(entry.pending):
                pod.waiting.pop(entry.op.id, None)

    def acquire(self, ticket: Ticket) -> Permit | Pending:
        """Admission while the failure mode is in force."""
        pod = self._pod
        assert pod.fallback is not None
        outcome = pod.fallback.acquire(ticket)
        if isinstance(outcome, Pending):
            assert isinstance(outcome.token, str)
            pod.waiting[outcome.token] = outcome
        return outcome

    async def next_probe(self) -> None:
        """Wait until the next recovery probe is due: at most ``RECOVERY_PROBE_S`` (or the
        heartbeat interval, if shorter), at once when ``probe_now`` is set."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(self._pod.interval_s, RECOVERY_PROBE_S)):
                await self.probe_now.wait()

    async def try_recover(self) -> None:
        pod = self._pod
        caller = self._caller
        # while unreachable this pod may have admitted seats Redis never counted, and so
        # may every pod that lost Redis with it: the call opens a roll call, and nothing
        # new is granted until each of them has re-asserted what it holds
        pod.batch.heartbeat = True
        pod.batch.reassert = True
        pod.batch.recover = True
        pod.batch.config = pod.config
        fallback = pod.fallback
        assert fallback is not None
        batch, pod.batch = pod.batch, Batch()
        args = caller.args_for(batch)
        try:
            reply = await caller.call(args, retry=False)
        except RedisUnavailable:
            caller.requeue(batch, [])
            fallback.reshare(self.local_share())
            return
        # the reply is applied while the failure mode still holds its waiters: a grant it
        # carries for one of them is for a waiter this very call cancelled (see on_note)
        caller.replies.apply(batch, [], reply, recovering=True)
        pod.fallback = None
        pod.degraded_since = None
        pod.capacity.set_degraded(False)
        moved = fallback.close()
        log.warning(
            "Redis reachable again for pool %r: %d lease(s) re-asserted, %d local waiter(s) "
            "handed back to the shared queue",
            pod.settings.pool,
            reply.reasserted,
            len(moved),
        )
        pod.batch.checked = True
        for pending in moved:
            caller.send_acquire(pod.renew(pending), "requeue", None)
        caller.kick()

    def local_share(self) -> int:
        """``floor(limit / live pods)``: in the failure mode the limit is this pod's own
        (the pool's ceiling as last heard, its own computed values). 0 for a pod that has
        never heard from Redis (it started during the outage): it knows neither the pool's
        ceiling nor how many pods share it, and counting itself alone, it admitted the
        whole limit beside the pods admitting their shares."""
        pod = self._pod
        if pod.seen_limit is None:
            return 0
        return pod.limit // max(1, pod.live_pods)
