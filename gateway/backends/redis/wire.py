"""The step script's calling convention: what a pod sends in one call and what it gets back.

``step.lua`` reads its arguments in exactly the order ``encode`` writes them; this module
is the only place that knows that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Arg = str | int | float


@dataclass(frozen=True, slots=True)
class PodConfig:
    """Fair-share settings a pod writes to the pool (after start and after a new epoch)."""

    default_weight: float
    default_cap: int | None
    weights: Sequence[tuple[str, float]]
    caps: Sequence[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class AcquireOp:
    """One request asking for seats: granted at once, queued, or refused in the script."""

    id: str
    tenant: str
    rank: int
    seats: int
    action: str
    wait_ms: int


@dataclass(slots=True)
class Batch:
    """Everything one pod has to tell Redis, gathered while the previous call was in flight."""

    config: PodConfig | None = None
    relearn: bool = False
    heartbeat: bool = False
    set_limit: int | None = None
    releases: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    acquires: list[AcquireOp] = field(default_factory=list)
    checked: bool = False
    """Some acquires may already be known to Redis (a retry, a waiter handed back):
    the script then checks each id before acting on it."""

    def __bool__(self) -> bool:
        return bool(
            self.config is not None
            or self.relearn
            or self.heartbeat
            or self.set_limit is not None
            or self.releases
            or self.cancels
            or self.acquires
        )


@dataclass(frozen=True, slots=True)
class Header:
    """What every call carries: who calls, and the pool's timing and bounds."""

    pod: str
    ttl_ms: int
    learn_ms: int
    channel_prefix: str
    init_limit: int
    max_queue: int


#: Index in ARGV of the flag saying a call may have run before (set on retries).
RETRIED = 6


def encode(
    header: Header,
    batch: Batch,
    leases: Sequence[tuple[str, str, int]] = (),
    waiters: Sequence[str] = (),
) -> list[Arg]:
    """ARGV for one call; ``leases`` (id, tenant, seats) and ``waiters`` (ids) are the
    heartbeat's report of what this pod holds, sent only when ``batch.heartbeat``.

    Each section is one space-separated string: ids and escaped tenants contain no
    spaces, and one argument per section keeps packing and parsing cheap on both sides.
    """
    config = ""
    if batch.config is not None:
        c = batch.config
        cap = -1 if c.default_cap is None else c.default_cap
        parts = [repr(c.default_weight), str(cap), str(len(c.weights))]
        for tenant, weight in c.weights:
            parts += [tenant, repr(weight)]
        parts.append(str(len(c.caps)))
        for tenant, tenant_cap in c.caps:
            parts += [tenant, str(tenant_cap)]
        config = " ".join(parts)
    held = ""
    waiting = ""
    if batch.heartbeat:
        held = " ".join(f"{lease} {tenant} {seats}" for lease, tenant, seats in leases)
        waiting = " ".join(waiters)
    acquires = " ".join(
        f"{op.id} {op.tenant} {op.rank} {op.seats} {op.action} {op.wait_ms}"
        for op in batch.acquires
    )
    return [
        header.pod,
        header.ttl_ms,
        header.learn_ms,
        header.channel_prefix,
        header.init_limit,
        header.max_queue,
        1 if batch.checked else 0,
        config,
        1 if batch.relearn else 0,
        1 if batch.heartbeat else 0,
        held,
        waiting,
        -1 if batch.set_limit is None else batch.set_limit,
        " ".join(batch.releases),
        " ".join(batch.cancels),
        acquires,
    ]


@dataclass(frozen=True, slots=True)
class Note:
    """A message to a pod about one of its waiters: granted (``reason`` None) or dropped."""

    id: str
    reason: str | None = None


def parse_notes(tokens: Sequence[str]) -> list[Note]:
    """``g:<id>`` (granted) and ``x:<reason>:<id>`` (dropped), as published or returned."""
    notes = []
    for token in tokens:
        kind, _, rest = token.partition(":")
        if kind == "g":
            notes.append(Note(rest))
        elif kind == "x":
            reason, _, waiter = rest.partition(":")
            notes.append(Note(waiter, reason))
    return notes


@dataclass(frozen=True, slots=True)
class StepReply:
    """The pool's state after a call, and the answers to what the call asked."""

    limit: int
    inflight: int
    queued: int
    epoch: str
    seq: int
    live_pods: int
    learning_ms: int
    answers: list[str]
    """Per acquire, in order: ``g`` granted, ``q`` queued, else the refusal's reason."""
    cancelled: list[str]
    """Per cancel: ``c`` unqueued, ``r`` a grant had won and was given back, ``-`` gone."""
    reasserted: int
    """Leases of this pod Redis no longer had, written back by this heartbeat."""
    missed: list[str]
    """Waiters of this pod granted without the pod hearing of it."""
    lost: list[str]
    """Waiters of this pod Redis no longer has (dropped while the pod was not heard from)."""
    notes: list[Note]
    """Grants and drops of this pod's waiters decided during this call."""


def decode(raw: Any) -> StepReply:
    (limit, inflight, queued, epoch, seq, pods, learning, answers, cancelled, reasserted,
     missed, lost, notes) = raw  # fmt: skip
    return StepReply(
        limit=int(limit),
        inflight=int(inflight),
        queued=int(queued),
        epoch=_text(epoch),
        seq=int(seq),
        live_pods=int(pods),
        learning_ms=int(learning),
        answers=_text(answers).split(),
        cancelled=_text(cancelled).split(),
        reasserted=int(reasserted),
        missed=_text(missed).split(),
        lost=_text(lost).split(),
        notes=parse_notes(_text(notes).split()),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
