"""The step script's calling convention: what a pod sends in one call and what it gets back.

``step.lua`` reads its arguments in exactly the order ``encode`` writes them; this module
is the only place that knows that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import redis.exceptions

from gateway.backends.redis.keys import escape_name

Arg = str | int | float


@dataclass(frozen=True, slots=True)
class PodConfig:
    """Fair-share settings a pod writes to the pool (after start and after a new epoch)."""

    default_weight: float
    default_cap: int | None
    weights: Sequence[tuple[str, float]]
    caps: Sequence[tuple[str, int]]
    max_tokens: int | None = None
    """``global_max_tokens_in_flight``; None when unset."""
    fair_by_tokens: bool = False


@dataclass(frozen=True, slots=True)
class AcquireOp:
    """One request asking for seats: granted at once, queued, or refused in the script."""

    id: str
    tenant: str
    rank: int
    seats: int
    action: str
    """The overflow policy's action (``wait``, ``queue``, ``evict``, ``reject``), or
    ``requeue`` for a waiter Redis dropped while its pod was away."""
    wait_ms: int
    tokens: int = 0
    """The request's token estimate (0 where the pool does not count tokens)."""


@dataclass(slots=True)
class Batch:
    """Everything one pod has to tell Redis, gathered while the previous call was in flight."""

    config: PodConfig | None = None
    recover: bool = False
    """This pod is back from its failure mode: open a roll call if none is open."""
    heartbeat: bool = False
    reassert: bool = False
    """With the heartbeat, this pod's roster: it answers the current roll call."""
    leave: bool = False
    """This pod is shutting down: the others drop it from their rosters."""
    ping: bool = False
    """Nothing to say but the header: hear the pool's news (membership, a roll call)."""
    ceiling: int | None = None
    """The operator's limit, set on this pod (``set_capacity``): the pool's ceiling."""
    computed: Mapping[str, int] | None = None
    """The computed providers' values, sent by the pod that holds the leader lease."""
    releases: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    confirms: list[str] = field(default_factory=list)
    """Grants this pod read too late to trust: does each lease still hold?"""
    acquires: list[AcquireOp] = field(default_factory=list)
    checked: bool = False
    """Some acquires may already be known to Redis (a retry, a waiter handed back):
    the script then checks each id before acting on it."""

    def __bool__(self) -> bool:
        return bool(
            self.config is not None
            or self.recover
            or self.heartbeat
            or self.reassert
            or self.leave
            or self.ping
            or self.ceiling is not None
            or self.computed is not None
            or self.releases
            or self.cancels
            or self.confirms
            or self.acquires
        )

    def flags(self) -> str:
        """The call's flags as ``step.lua`` reads them (ARGV 10)."""
        names = ("heartbeat", "reassert", "recover", "leave")
        return " ".join(name for name in names if getattr(self, name))


@dataclass(frozen=True, slots=True)
class Header:
    """What every call carries: who calls, and the pool's timing and bounds."""

    pod: str
    ttl_ms: int
    learn_ms: int
    channel_prefix: str
    init_ceiling: int
    """The ceiling of a pool Redis does not have (this pod's operator limit)."""
    max_queue: int
    mver: int
    """The pool's membership version this pod last heard the roster of (-1: none yet)."""
    probe: bool
    """Compare Redis' run_id with the pool's: on heartbeats and on fresh connections."""
    seen: tuple[str, int] | None
    """The latest (epoch, seq) this pod saw: Redis behind it means a failover lost writes."""
    cver: int = -1
    """The pool's capacity version this pod last heard the capacity of (-1: none yet)."""


#: Index in ARGV of the flag saying a call may have run before (set on retries).
RETRIED = 6
#: Index in ARGV of the flag asking the script to compare Redis' run_id (set on retries).
PROBE = 7
#: Index in ARGV of the deadline past which the script must not run the call (ms, Redis'
#: clock; 0 for none): set for each attempt, just before it is sent.
DEADLINE = 20


def encode(
    header: Header,
    batch: Batch,
    leases: Sequence[tuple[str, str, int, int]] = (),
    waiters: Sequence[str] = (),
    roster: Mapping[str, int] | None = None,
) -> list[Arg]:
    """ARGV for one call; ``leases`` (id, tenant, seats, tokens) and ``waiters`` (ids) are the
    heartbeat's report of what this pod holds, sent only when ``batch.heartbeat``;
    ``roster`` (pod id → liveness, Redis ms) the pods it knows, sent with ``reassert``.

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
        parts += [str(-1 if c.max_tokens is None else c.max_tokens), str(int(c.fair_by_tokens))]
        config = " ".join(parts)
    held = ""
    waiting = ""
    known = ""
    if batch.heartbeat:
        held = " ".join(
            f"{lease} {tenant} {seats} {tokens}" for lease, tenant, seats, tokens in leases
        )
        waiting = " ".join(waiters)
    if batch.reassert and roster:
        known = " ".join(f"{pod} {alive_until}" for pod, alive_until in roster.items())
    acquires = " ".join(
        f"{op.id} {op.tenant} {op.rank} {op.seats} {op.tokens} {op.action} {op.wait_ms}"
        for op in batch.acquires
    )
    return [
        header.pod,
        header.ttl_ms,
        header.learn_ms,
        header.channel_prefix,
        header.init_ceiling,
        header.max_queue,
        1 if batch.checked else 0,
        1 if header.probe else 0,
        header.mver,
        "" if header.seen is None else f"{header.seen[0]} {header.seen[1]}",
        batch.flags(),
        config,
        held,
        waiting,
        known,
        -1 if batch.ceiling is None else batch.ceiling,
        " ".join(batch.releases),
        " ".join(batch.cancels),
        " ".join(batch.confirms),
        acquires,
        0,
        " ".join(f"{escape_name(name)} {value}" for name, value in (batch.computed or {}).items()),
        header.cver,
    ]


@dataclass(frozen=True, slots=True)
class Note:
    """A message to a pod about one of its waiters: granted (``reason`` None) or dropped.

    ``expires`` is a grant's lease expiry on Redis' clock (ms), when the grant said it:
    a pod that reads the grant later than that can trust confirms it first.
    """

    id: str
    reason: str | None = None
    expires: int | None = None


@dataclass(frozen=True, slots=True)
class News:
    """What a pod's channel said besides its waiters' notes."""

    roll_call: bool = False
    """A roll call is open: re-assert what this pod holds (``e``)."""
    membership: bool = False
    """A pod joined or left: hear the new roster (``m``)."""


def parse_notes(tokens: Sequence[str]) -> tuple[list[Note], News]:
    """``g:<id>:<expiry>`` (granted), ``x:<reason>:<id>`` (dropped), ``e`` and ``m``
    (news), as published or returned."""
    notes = []
    roll_call = membership = False
    for token in tokens:
        kind, _, rest = token.partition(":")
        if kind == "g":
            waiter, _, expires = rest.partition(":")
            notes.append(Note(waiter, expires=int(expires) if expires.isdigit() else None))
        elif kind == "x":
            reason, _, waiter = rest.partition(":")
            notes.append(Note(waiter, reason))
        elif kind == "e":
            roll_call = True
        elif kind == "m":
            membership = True
    return notes, News(roll_call, membership)


@dataclass(frozen=True, slots=True)
class ComputedValue:
    """A computed provider's value in the pool: who wrote it, and when (Redis' clock, ms)."""

    value: int
    pod: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """What the pool's limit is made of: the operator's ceiling and the computed providers'
    values, by provider name (only those written within two lease TTLs)."""

    ceiling: int
    computed: Mapping[str, ComputedValue]


@dataclass(frozen=True, slots=True)
class StepReply:
    """The pool's state after a call, and the answers to what the call asked."""

    limit: int
    inflight: int
    queued: int
    """Waiters in the fair queue (bounded by ``max_queue``); not those in its lobby."""
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
    now_ms: int
    """Redis' clock when the call ran."""
    mver: int
    """The pool's membership version."""
    roster: dict[str, int] | None
    """Live pods → liveness (Redis ms), when the call told it (heartbeats, and whenever
    the pod's version was behind); None otherwise."""
    asserted: bool
    """This pod has answered the current roll call (always true with roll calls off)."""
    confirmed: list[str]
    """Per confirmation: ``y`` the lease still holds, ``n`` it is gone."""
    new_epoch: str
    """Why this call started a new epoch: ``lost`` (Redis had no pool), ``seq`` (the pool
    was behind what this pod saw), ``runid`` (another Redis server answers); else empty."""
    cver: int = 0
    """The pool's capacity version."""
    capacity: PoolLimits | None = None
    """The ceiling and computed values, when the call told them (heartbeats, a change, and
    whenever the pod's version was behind); None otherwise."""
    tokens_inflight: int = 0
    """The token estimates of the pool's leases (counted with a token budget, or fairness
    by tokens)."""


class LateCall(redis.exceptions.ResponseError):
    """Redis reached the call after its deadline, and therefore changed nothing.

    ``now_ms`` is Redis' clock then: the pod's estimate of it was behind.
    """

    def __init__(self, now_ms: int) -> None:
        super().__init__("Redis reached the call after the pod's deadline for it")
        self.now_ms = now_ms

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.now_ms,))


def decode(raw: Any) -> StepReply:
    if len(raw) == 2:
        raise LateCall(int(raw[1]))
    (limit, inflight, queued, epoch, seq, pods, learning, answers, cancelled, reasserted,
     missed, lost, notes, now_ms, mver, told, roster, asserted, confirmed, why, cver,
     capacity, tokens) = raw  # fmt: skip
    own, _ = parse_notes(_text(notes).split())
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
        notes=own,
        now_ms=int(now_ms),
        mver=int(mver),
        roster=_roster(_text(roster)) if int(told) else None,
        asserted=bool(int(asserted)),
        confirmed=_text(confirmed).split(),
        new_epoch=_text(why),
        cver=int(cver),
        capacity=_capacity(_text(capacity)),
        tokens_inflight=int(tokens),
    )


def _capacity(text: str) -> PoolLimits | None:
    """``<ceiling> <provider> <value> <pod> <ms>...`` as the script tells it; None for ''."""
    words = text.split()
    if not words:
        return None
    computed = {
        unquote(words[at]): ComputedValue(int(words[at + 1]), words[at + 2], int(words[at + 3]))
        for at in range(1, len(words) - 3, 4)
    }
    return PoolLimits(int(words[0]), computed)


def _roster(text: str) -> dict[str, int]:
    words = text.split()
    return {pod: int(float(alive)) for pod, alive in zip(words[::2], words[1::2], strict=True)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
