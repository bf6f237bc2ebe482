"""The leases this pod holds and its heartbeat.

A grant becomes a held lease when it reaches the pod (in a reply, on the pod's channel,
or found by a heartbeat when its message was lost); one read too late to trust is
confirmed with Redis before the request runs. The heartbeat (every third of the lease
TTL, with jitter) renews the pod's leases, writes back the ones Redis forgot, and picks
up grants whose message was lost; in the failure mode the same loop probes for Redis.
"""

from __future__ import annotations

import asyncio
import random

from gateway.backends.redis.calls import Caller
from gateway.backends.redis.failure_mode import FailureMode
from gateway.backends.redis.pod import PodState, fail, reason_of
from gateway.backends.redis.wire import Note
from gateway.protocols import Permit


class Leases:
    """Grants as they reach this pod, releases, and the heartbeat loop."""

    def __init__(self, pod: PodState, caller: Caller, failure: FailureMode) -> None:
        self._pod = pod
        self._caller = caller
        self._failure = failure

    def release(self, lease: str) -> None:
        pod = self._pod
        ticket = pod.held.pop(lease, None)
        if ticket is None:
            return
        if pod.fallback is not None:
            pod.fallback.release(lease)
        pod.batch.releases.append(lease)
        self._caller.kick()

    def on_note(self, note: Note) -> None:
        """A grant or a drop for one of this pod's waiters, however it reached us."""
        pod = self._pod
        pod.notes_received["granted" if note.reason is None else note.reason] += 1
        if pod.fallback is not None and pod.fallback.waits(note.id):
            # adopted by the failure mode, and its cancel is on its way to Redis, which
            # then takes back whatever it granted: running the request on that lease
            # would run it on a seat Redis counts as free
            return
        if (
            note.reason is None
            and note.expires is not None
            and note.id in pod.waiting
            and not pod.clock.outlives(note.expires, pod.interval_ms)
        ):
            # read too late to trust (this pod was frozen, or its loop held up): the lease
            # may have expired and its seat gone to another pod, so Redis confirms it first
            pod.notes_received["stale"] += 1
            pod.confirmed.discard(note.id)
            if note.id not in pod.confirming:
                pod.confirming.add(note.id)
                pod.batch.confirms.append(note.id)
                self._caller.kick()
            return
        pending = pod.waiting.pop(note.id, None)
        pod.confirmed.discard(note.id)
        pod.confirming.discard(note.id)
        if note.reason is not None:
            if pending is not None:
                fail(pending, pod.reject(reason_of(note.reason)))
            return
        if pending is None:
            if note.id not in pod.held:
                # a grant nobody waits for any more (cancelled, or a call we gave up on)
                pod.batch.releases.append(note.id)
                self._caller.kick()
            return
        pod.held[note.id] = pending.ticket
        if pending.future.done():
            self.release(note.id)
        else:
            pending.future.set_result(Permit(pending.ticket, note.id))

    def on_confirmation(self, waiter_id: str, holds: bool) -> None:
        """Redis' answer about a grant read too late: run it, or wait for a seat again."""
        pod = self._pod
        if waiter_id not in pod.confirming:
            if holds and waiter_id not in pod.held:
                pod.batch.releases.append(waiter_id)  # cancelled meanwhile
            return
        pod.confirming.discard(waiter_id)
        if holds:
            self.on_note(Note(waiter_id))
        else:
            pod.notes_received["stale_given_back"] += 1
            self.queue_again(waiter_id)

    def queue_again(self, waiter_id: str) -> None:
        """Redis no longer has this waiter (it dropped it while the pod was away, or its
        grant expired unseen): it waits in the shared queue again, under a new id, past
        ``max_queue`` if need be. It is never answered ``evicted`` for it."""
        pod = self._pod
        pending = pod.waiting.get(waiter_id)
        pod.confirmed.discard(waiter_id)
        if pending is None or pending.future.done():
            return
        pod.notes_received["queued_again"] += 1
        pod.batch.checked = True
        self._caller.send_acquire(pod.renew(pending), "requeue", None)

    async def heartbeats(self) -> None:
        pod = self._pod
        while pod.running:
            if pod.fallback is None:
                await asyncio.sleep(pod.interval_s * random.uniform(0.8, 1.0))  # noqa: S311
            else:
                await self._failure.next_probe()
            self._failure.probe_now.clear()
            if pod.fallback is None:
                pod.batch.heartbeat = True
                self._caller.kick()
            else:
                await self._failure.try_recover()
