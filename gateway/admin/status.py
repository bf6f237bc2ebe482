"""What ``GET /api/v1/status`` reports: the gateway's state at one instant, read from the
one source of truth (the counter backend, the providers, the readings), for operators and
the dashboard. Plain JSON-able dicts; nothing here changes anything."""

from __future__ import annotations

import math
import time
from typing import Any

from gateway.admin.contract import FROM_OWN, FROM_POOL
from gateway.capacity import is_computed
from gateway.gateway import Gateway
from gateway.protocols import Snapshot
from gateway.routing.decisions import REROUTED, ROUTED


def status(gateway: Gateway) -> dict[str, Any]:
    """The gateway's state now; see docs/operations.md for each field.

    At most ``telemetry_tenants`` tenants are listed by name, the most active first; the
    rest are summed up as ``other``, so that a flood of tenants cannot make the answer
    grow without bound."""
    snapshot = gateway.snapshot()
    return {
        "capacity": {
            "max_in_flight": snapshot.limit,
            "providers": gateway.provider_limits(),
            "computed": _computed(gateway),
        },
        "in_flight": snapshot.inflight,
        "tokens_in_flight": snapshot.tokens_inflight,
        "max_tokens_in_flight": snapshot.max_tokens,
        "queued": snapshot.queued,
        "max_queue": snapshot.max_queue,
        "queued_by_class": snapshot.queued_by_priority(),
        "tenants": _tenants(snapshot, gateway.settings.telemetry_tenants),
        "upstreams": _upstreams(gateway),
        "routing": _routing(gateway),
        "cluster": _cluster(gateway),
        "started": gateway.started,
    }


def _computed(gateway: Gateway) -> dict[str, Any]:
    """Where each computed provider's value comes from: ``pool`` (the leader's, with the
    pod that wrote it and when, on Redis' clock) or ``own`` (this process computed it: in
    process, before the pod has heard the pool's, and while Redis cannot be reached)."""
    pool = gateway.pool_capacity
    here = getattr(gateway.backend, "pod", None)
    found: dict[str, Any] = {}
    for name, provider in gateway.providers.items():
        if not is_computed(provider):
            continue
        entry = pool.in_use(name) if pool is not None else None
        if entry is None:
            found[name] = {"source": FROM_OWN, "pod": here, "at": None}
        else:
            found[name] = {"source": FROM_POOL, "pod": entry.pod, "at": entry.at_ms / 1000}
    return found


def _tenants(snapshot: Snapshot, shown: int) -> dict[str, Any]:
    """The ``shown`` most active tenants (seats held plus requests waiting) by name, and
    the others summed up as ``other``."""

    def activity(item: tuple[str, Any]) -> tuple[int, str]:
        name, state = item
        return (-(state.inflight + sum(state.queued.values())), name)

    ranked = sorted(snapshot.tenants.items(), key=activity)
    listed = {}
    for name, state in ranked[:shown]:
        listed[name] = {
            "in_flight": state.inflight,
            "waiting": sum(state.queued.values()),
            "weight": state.weight,
            "share": state.inflight / snapshot.inflight if snapshot.inflight else 0.0,
        }
    rest = ranked[shown:]
    return {
        "listed": listed,
        "other": {
            "tenants": len(rest),
            "in_flight": sum(state.inflight for _, state in rest),
            "waiting": sum(sum(state.queued.values()) for _, state in rest),
        },
    }


def _upstreams(gateway: Gateway) -> dict[str, Any]:
    readings = gateway.readings
    router = gateway.router
    ours = router.fleet.inflight.totals() if router is not None else {}
    routed = router.decisions.counts() if router is not None else {}
    now = time.monotonic()
    result = {}
    for upstream in readings:
        reading = readings.get(upstream)
        age = reading.age_s(now)
        result[upstream] = {
            "healthy": reading.healthy,
            "in_flight": ours.get(upstream, 0),
            "routed": routed.get((upstream, ROUTED), 0),
            "rerouted": routed.get((upstream, REROUTED), 0),
            "running": reading.running,
            "waiting": reading.waiting,
            "kv_usage": reading.kv_usage,
            "reading_age_s": None if math.isinf(age) else round(age, 3),
        }
    return result


def _routing(gateway: Gateway) -> dict[str, Any] | None:
    """None without upstreams; else the policy and the latest choices, newest first."""
    router = gateway.router
    if router is None:
        return None
    return {"policy": router.policy, "recent": router.decisions.recent()}


def _cluster(gateway: Gateway) -> dict[str, Any] | None:
    """None in process; in cluster mode the pool as this pod last heard it from Redis."""
    settings = gateway.settings
    if settings.redis_url is None:
        return None
    backend: Any = gateway.backend
    return {
        "pool": settings.pool,
        "pod": backend.pod,
        "leader": backend.leader,
        "live_pods": backend.live_pods,
        "mode": backend.mode,
        "degraded": backend.degraded_since is not None,
        "failure_mode": settings.redis_failure_mode,
    }
