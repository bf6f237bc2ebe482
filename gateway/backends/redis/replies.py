"""Applying the step script's replies: what a pod learns of its pool from each call.

A reply tells the pod the pool's limit, capacity and counts, the epoch and sequence of
the pool's state (a new epoch means Redis lost or rolled back what it held: the pod
re-asserts its leases and queues its waiters again), the roster of a roll call, and the
answer to each acquire, confirmation and note the call carried; the waiters it speaks of
are settled here. ``Caller`` (``calls.py``) sends the calls and hands each reply over.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.backends.redis.pod import PodState, fail, reason_of
from gateway.backends.redis.wire import Batch, Note, StepReply

if TYPE_CHECKING:
    from gateway.backends.redis.calls import Caller, SentAcquire
    from gateway.backends.redis.leases import Leases

log = logging.getLogger("obleth.cluster")


class Replies:
    """Applies each reply of the step script to the pod (``apply``), and keeps what the
    calls must tell Redis of what this pod has heard: the epoch and sequence it has seen
    (``seen``), the roster and membership version of the last roll call (``roster``,
    ``mver``). ``attach`` gives it the leases that grants and notes go to."""

    _leases: Leases

    def __init__(self, pod: PodState, caller: Caller, *, ttl_ms: int) -> None:
        self._pod = pod
        self._caller = caller
        self._ttl_ms = ttl_ms
        # what this pod knows of the pool, for roll calls (see step.lua)
        self.roster: dict[str, int] = {}  # live pods → liveness (Redis ms)
        self.mver = -1
        self.epoch: str | None = None
        self.seq = 0

    def attach(self, leases: Leases) -> None:
        self._leases = leases

    @property
    def seen(self) -> tuple[str, int] | None:
        """The epoch and sequence of the pool's state this pod last heard; None before
        its first reply."""
        return None if self.epoch is None else (self.epoch, self.seq)

    def apply(
        self, batch: Batch, ops: list[SentAcquire], reply: StepReply, *, recovering: bool = False
    ) -> None:
        """Apply ``reply``, the answer to a call that carried ``batch`` and the acquires
        ``ops``; ``recovering`` for the failure mode's recovery call, whose re-assertions
        are expected rather than a sign of lost state."""
        pod = self._pod
        new_epoch = self.epoch is not None and reply.epoch != self.epoch
        if self.epoch is None or new_epoch:
            self.seq = 0
        self.epoch = reply.epoch
        self.seq = max(self.seq, reply.seq)
        pod.seen_limit = reply.limit
        if new_epoch:
            pod.capacity.forget()
        if reply.capacity is not None:
            # a ceiling of this pod's still on its way is newer than the one in this reply
            pod.capacity.hear(
                reply.capacity, reply.cver, ceiling_pending=pod.batch.ceiling is not None
            )
        pod.inflight = reply.inflight
        pod.tokens_inflight = reply.tokens_inflight
        pod.queued = reply.queued
        pod.live_pods = max(1, reply.live_pods)
        pod.learning_ms = reply.learning_ms
        pod.reasserted += reply.reasserted
        if reply.roster is not None and reply.asserted:
            # kept until this pod has answered the roll call: after a loss Redis knows
            # fewer pods than this roster does, and the roll call needs them all
            self.roster = reply.roster
            self.mver = reply.mver
        if not reply.asserted:
            # a roll call is open (or this pod came back after its liveness passed): Redis
            # grants it nothing until it has re-asserted what it holds
            pod.batch.heartbeat = True
            pod.batch.reassert = True
        if reply.reasserted and not recovering:
            log.warning(
                "pod %s re-asserted %d lease(s) Redis no longer had (Redis lost state, or this "
                "pod was paused or cut off for longer than lease_ttl_s=%s)",
                pod.id,
                reply.reasserted,
                pod.settings.lease_ttl_s,
            )

        leases = self._leases
        # waiters Redis knew before this call: after a new epoch it has forgotten them
        known_before = pod.queued_in_redis() if new_epoch else []
        # the lease of a grant made (or renewed) by this call; read in time, as replies
        # nearly always are, it needs no check of its own
        granted_until: int | None = reply.now_ms + self._ttl_ms
        if pod.clock.outlives(reply.now_ms + self._ttl_ms, pod.interval_ms):
            granted_until = None
        for entry, answer in zip(ops, reply.answers, strict=True):
            self._settle(entry, answer, granted_until)
        for waiter_id, answer in zip(batch.confirms, reply.confirmed, strict=True):
            leases.on_confirmation(waiter_id, answer == "y")
        for note in reply.notes:
            leases.on_note(note)
        for waiter_id in reply.missed:
            pod.notes_received["missed"] += 1  # found by the heartbeat, not by a message
            leases.on_note(Note(waiter_id, expires=granted_until))  # the heartbeat renewed it

        if new_epoch:
            log.warning(
                "%s (new epoch %s): re-asserting %d lease(s) and %d waiter(s)",
                _EPOCH_CAUSES.get(reply.new_epoch, _EPOCH_CAUSES[""]).format(
                    pool=pod.settings.pool
                ),
                reply.epoch,
                len(pod.held),
                len(pod.confirmed),
            )
            pod.batch.config = pod.config
            pod.batch.heartbeat = True
            pod.batch.checked = True
            for waiter_id in known_before:
                pending = pod.waiting.get(waiter_id)
                if pending is not None:
                    pod.confirmed.discard(waiter_id)
                    self._caller.send_acquire(pending, "requeue", None)
        else:
            for waiter_id in reply.lost:
                if waiter_id in pod.confirmed:
                    leases.queue_again(waiter_id)
        if reply.learning_ms and pod.waiting:
            self._caller.call_back_in(reply.learning_ms / 1000)
        if pod.batch:
            self._caller.kick()

    def _settle(self, entry: SentAcquire, answer: str, granted_until: int | None) -> None:
        """Apply Redis' answer to one acquire, then wake its caller."""
        pod = self._pod
        waiter_id = entry.op.id
        pending = entry.pending
        if answer == "g":
            self._leases.on_note(Note(waiter_id, expires=granted_until))
        elif answer == "q":
            # not waiting any more: cancelled (its cancel follows this call), or granted
            # already by a message that overtook this reply, so no cancel from here
            if waiter_id in pod.waiting:
                pod.confirmed.add(waiter_id)
        else:
            if pod.waiting.pop(waiter_id, None) is not None:
                fail(pending, pod.reject(reason_of(answer)))
        entry.wake()


#: What a pod logs when it finds a new epoch, by the cause the call gave.
_EPOCH_CAUSES = {
    "lost": "Redis lost pool {pool!r} (a restart without persistence, FLUSHALL, eviction)",
    "seq": "Redis pool {pool!r} went back in time: a failover lost writes",
    "runid": "Redis pool {pool!r} is served by another Redis server (a failover or a restart)",
    "": "Redis pool {pool!r} started a new epoch (another pod found it lost or rolled back)",
}
