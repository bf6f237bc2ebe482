"""Check a pool's invariants in Redis: what tests assert after every fault, and what an
operator can run against a live pool.

The pool is consistent when the seats counted in flight equal the seats of the leases
and the sum of every tenant's seats (and the tokens in flight the tokens of the leases,
per tenant too), every lease has its metadata, and every waiter is
in the queue or the lobby, in the deadline index and in its tenant's count; given the
pods' ``max_queue``, also when nobody waits in the lobby while the queue has room. Read
by one script, so the answer describes one instant even while pods keep calling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.backends.redis.keys import PoolKeys
from gateway.core.turns import IDLE_TURNS


@dataclass(frozen=True, slots=True)
class PoolAudit:
    """What one read of the pool found; ``problems`` is empty when it is consistent."""

    inflight: int
    lease_seats: int
    tenant_seats: int
    leases: int
    waiters: int
    """Every waiter: in the queue and in the lobby."""
    limit: int | None
    problems: list[str] = field(default_factory=list)
    lobby: int = 0
    """Waiters for room in the full queue (``block``)."""

    @property
    def empty(self) -> bool:
        """Nothing held and nobody waiting."""
        return self.inflight == 0 and self.leases == 0 and self.waiters == 0

    @property
    def ok(self) -> bool:
        return not self.problems


_READ = """
return {
  redis.call('HGETALL', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[3]),
  redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5]), redis.call('ZCARD', KEYS[6]),
  redis.call('HLEN', KEYS[7]), redis.call('ZCARD', KEYS[8]), redis.call('ZCARD', KEYS[9]),
  redis.call('HKEYS', KEYS[10]), redis.call('ZRANGE', KEYS[11], 0, -1),
  redis.call('HGETALL', KEYS[12]),
}
"""


_NAMES = (
    "state", "leases", "lmeta", "tin", "tq", "wq", "wmeta", "wdl", "lobby", "turns", "idle", "ttok"
)  # fmt: skip


async def audit(client: Any, pool: str, *, max_queue: int | None = None) -> PoolAudit:
    """Read pool ``pool`` through ``client`` (a redis-py asyncio client) and check it;
    ``max_queue``, when given, is the pods' setting."""
    keys = PoolKeys(pool)
    raw = await client.eval(_READ, len(_NAMES), *(keys.key(n) for n in _NAMES))
    return _parse(raw, max_queue)


def audit_sync(client: Any, pool: str, *, max_queue: int | None = None) -> PoolAudit:
    """``audit`` through a synchronous redis-py client."""
    keys = PoolKeys(pool)
    return _parse(client.eval(_READ, len(_NAMES), *(keys.key(n) for n in _NAMES)), max_queue)


def _parse(raw: list[Any], max_queue: int | None) -> PoolAudit:
    state, leases, lmeta, tin, tq, wq, wmeta, wdl, lobby, turns, idle, ttok = raw
    audited = check(
        _pairs(state),
        leases,
        _pairs(lmeta),
        _pairs(tin),
        _pairs(tq),
        wq,
        wmeta,
        wdl,
        lobby=lobby,
        max_queue=max_queue,
    )
    active = {_s(t) for t in tin[::2]} | {_s(t) for t in tq[::2]}
    audited.problems.extend(_turn_problems(active, {_s(t) for t in turns}, [_s(t) for t in idle]))
    audited.problems.extend(_token_problems(_pairs(state), _pairs(lmeta), _pairs(ttok)))
    return audited


def _token_problems(
    state: dict[Any, Any], lmeta: dict[Any, Any], ttok: dict[Any, Any]
) -> list[str]:
    """The tokens in flight (see step.lua's ``add_tokens``): the pool's count and each
    tenant's are the sums of their leases' (records ``tenant|seats|tokens|pod``)."""
    by_tenant: dict[str, int] = {}
    for meta in lmeta.values():
        parts = _s(meta).split("|")
        if len(parts) >= 4 and int(parts[2]):
            by_tenant[parts[0]] = by_tenant.get(parts[0], 0) + int(parts[2])
    counted = int(_s(next((v for k, v in state.items() if _s(k) == "tokens"), 0)))
    kept = {_s(t): int(_s(v)) for t, v in ttok.items()}
    problems = []
    if counted != sum(by_tenant.values()):
        problems.append(
            f"tokens disagree: tokens={counted}, sum of lease tokens={sum(by_tenant.values())}"
        )
    if kept != by_tenant:
        problems.append(f"tenant tokens disagree with their leases: {kept} != {by_tenant}")
    return problems


def _turn_problems(active: set[str], turns: set[str], idle: list[str]) -> list[str]:
    """The fair queue's turns (see step.lua's ``rekey``): every active tenant has one, an
    idle tenant keeps one only while ``idle`` lists it, and ``idle`` stays bounded."""
    problems = []
    if active - turns:
        problems.append(f"active tenant(s) without a turn: {sorted(active - turns)[:5]}")
    stray = turns - active - set(idle)
    if stray:
        problems.append(f"turn(s) of tenants neither active nor idle: {sorted(stray)[:5]}")
    if len(idle) > IDLE_TURNS:
        problems.append(f"{len(idle)} idle tenants keep turns, above {IDLE_TURNS}")
    return problems


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def check(
    state: dict[Any, Any],
    leases: int,
    lmeta: dict[Any, Any],
    tin: dict[Any, Any],
    tq: dict[Any, Any],
    wq: int,
    wmeta: int,
    wdl: int,
    *,
    lobby: int = 0,
    max_queue: int | None = None,
) -> PoolAudit:
    text = {_s(k): _s(v) for k, v in state.items()}
    inflight = int(text.get("inflight", 0))
    lease_seats = sum(int(_s(meta).split("|")[1]) for meta in lmeta.values())
    tenant_seats = sum(int(_s(v)) for v in tin.values())
    queued = sum(int(_s(v)) for v in tq.values())
    problems = []
    if not inflight == lease_seats == tenant_seats:
        problems.append(
            f"seats disagree: inflight={inflight}, sum of lease seats={lease_seats}, "
            f"sum of tenant seats={tenant_seats}"
        )
    if leases != len(lmeta):
        problems.append(f"{leases} leases but {len(lmeta)} lease records")
    if not wq + lobby == wmeta == wdl == queued:
        problems.append(
            f"waiters disagree: queue={wq}, lobby={lobby}, records={wmeta}, deadlines={wdl}, "
            f"tenant counts={queued}"
        )
    if lobby and max_queue is not None and wq < max(max_queue, 1):
        problems.append(
            f"{lobby} waiter(s) wait for room in the lobby while the queue has room "
            f"({wq} waiting, max_queue={max_queue})"
        )
    if any(int(_s(v)) <= 0 for v in tin.values()):
        problems.append("a tenant is listed with no seats")
    limit = int(text["limit"]) if "limit" in text else None
    return PoolAudit(inflight, lease_seats, tenant_seats, leases, wmeta, limit, problems, lobby)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
