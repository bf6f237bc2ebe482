"""The gateway's OpenTelemetry instruments, through the API only.

Almost all of them are observable: they read the gateway (its snapshot, providers, tallies,
router) when a reader collects, a Prometheus scrape say, so they cost the request path
nothing beyond the tallies' dictionary increments. The one synchronous instrument is the
queue-wait histogram, which the API offers no observable form of: it is recorded for
requests the scheduler decided on (see ``obleth.queue.wait`` below).

One set of instruments per meter provider, whatever the number of gateways in the process:
each callback reports every live gateway it watches, told apart by the ``pool``
attribute (and, for the cluster gauges, ``pod``). Names as Prometheus shows them are in
docs/operations.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation

if TYPE_CHECKING:
    from gateway.gateway import Gateway

#: the queue-wait histogram's bucket bounds, in seconds: from "no wait to speak of" to the
#: longest waits a client still holds on for
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_Callback = Callable[[CallbackOptions], Iterable[Observation]]


def watch(gateway: Gateway, provider: MeterProvider | None = None) -> None:
    """Report ``gateway`` through ``provider``'s instruments (default: the global provider,
    as it is now). Watching the same gateway twice with one provider changes nothing; the
    instruments hold gateways weakly and forget them once they are gone."""
    provider = provider if provider is not None else metrics.get_meter_provider()
    instruments = _BY_PROVIDER.get(provider)
    if instruments is None:
        instruments = _BY_PROVIDER[provider] = _Instruments(provider)
    if gateway not in instruments.gateways:
        instruments.gateways.add(gateway)
        gateway.queue_waits.append(instruments.queue_wait)


class _Instruments:
    def __init__(self, provider: MeterProvider) -> None:
        self.gateways: weakref.WeakSet[Gateway] = weakref.WeakSet()
        meter = metrics.get_meter("obleth", meter_provider=provider)
        create = {
            "gauge": meter.create_observable_gauge,
            "counter": meter.create_observable_counter,
        }
        for kind, name, read, unit, description in _OBSERVED:
            create[kind](name, [self._each(read)], unit=unit, description=description)
        self.queue_wait: Histogram = meter.create_histogram(
            "obleth.queue.wait",
            unit="s",
            description="time from arrival to admission of requests the scheduler decided on: "
            "those that found no free seat in process, every request in cluster mode",
            explicit_bucket_boundaries_advisory=list(WAIT_BUCKETS_S),
        )

    def _each(self, read: Callable[[Gateway], Iterator[Observation]]) -> _Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [found for gateway in list(self.gateways) for found in read(gateway)]

        return observe


_BY_PROVIDER: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _pool(gateway: Gateway) -> dict[str, str]:
    return {"pool": gateway.settings.pool}


def _in_flight(gateway: Gateway) -> Iterator[Observation]:
    yield Observation(gateway.snapshot().inflight, _pool(gateway))


def _tokens_in_flight(gateway: Gateway) -> Iterator[Observation]:
    tokens = gateway.snapshot().tokens_inflight
    if tokens is not None:
        yield Observation(tokens, _pool(gateway))


def _queue_depth(gateway: Gateway) -> Iterator[Observation]:
    pool = gateway.settings.pool
    for priority, count in gateway.snapshot().queued_by_priority().items():
        yield Observation(count, {"pool": pool, "priority": priority})


def _limit(gateway: Gateway) -> Iterator[Observation]:
    yield Observation(gateway.snapshot().limit, _pool(gateway))


def _provider_limits(gateway: Gateway) -> Iterator[Observation]:
    pool = gateway.settings.pool
    for name, value in gateway.provider_limits().items():
        yield Observation(value, {"pool": pool, "provider": name})


def _requests(gateway: Gateway) -> Iterator[Observation]:
    pool = gateway.settings.pool
    for (tenant, priority, outcome, reason), count in gateway.tallies.totals().items():
        attributes = {
            "pool": pool,
            "tenant": tenant,
            "priority": priority,
            "outcome": outcome,
            "reason": reason,
        }
        yield Observation(count, attributes)


def _upstream_in_flight(gateway: Gateway) -> Iterator[Observation]:
    router = gateway.router
    if router is None:
        return
    pool = gateway.settings.pool
    for upstream, count in router.fleet.inflight.local().items():
        yield Observation(count, {"pool": pool, "upstream": upstream})


def _upstream_healthy(gateway: Gateway) -> Iterator[Observation]:
    pool = gateway.settings.pool
    readings = gateway.readings
    for upstream in readings:
        healthy = readings.get(upstream).healthy
        yield Observation(1 if healthy else 0, {"pool": pool, "upstream": upstream})


def _upstream_requests(gateway: Gateway) -> Iterator[Observation]:
    pool = gateway.settings.pool
    for (upstream, status), count in gateway.answers.totals().items():
        yield Observation(count, {"pool": pool, "upstream": upstream, "status": status})


def _pod(gateway: Gateway) -> Any | None:
    """The Redis backend of a gateway in cluster mode (its ``pod``, ``mode``,
    ``local_share``, ``reasserted``); None in process."""
    if gateway.settings.redis_url is None:
        return None
    return gateway.backend


def _cluster_degraded(gateway: Gateway) -> Iterator[Observation]:
    backend = _pod(gateway)
    if backend is None:
        return
    mode = backend.mode
    attributes = {"pool": gateway.settings.pool, "pod": backend.pod, "mode": mode}
    yield Observation(0 if mode == "redis" else 1, attributes)


def _cluster_local_share(gateway: Gateway) -> Iterator[Observation]:
    backend = _pod(gateway)
    if backend is not None:
        yield Observation(backend.local_share, {"pool": gateway.settings.pool, "pod": backend.pod})


def _cluster_reasserted(gateway: Gateway) -> Iterator[Observation]:
    backend = _pod(gateway)
    if backend is not None:
        yield Observation(backend.reasserted, {"pool": gateway.settings.pool, "pod": backend.pod})


def _routing_decisions(gateway: Gateway) -> Iterator[Observation]:
    router = gateway.router
    if router is None:
        return
    pool = gateway.settings.pool
    for (upstream, kind), count in router.decisions.counts().items():
        yield Observation(count, {"pool": pool, "upstream": upstream, "kind": kind})


#: every observable instrument: kind, name, what reads it from a gateway, unit, description
_OBSERVED: tuple[tuple[str, str, Callable[[Gateway], Iterator[Observation]], str, str], ...] = (
    ("gauge", "obleth.in_flight", _in_flight, "{request}", "seats held by admitted requests"),
    (
        "gauge",
        "obleth.tokens_in_flight",
        _tokens_in_flight,
        "{token}",
        "the token estimates of admitted requests (with global_max_tokens_in_flight)",
    ),
    (
        "gauge",
        "obleth.queue_depth",
        _queue_depth,
        "{request}",
        "requests waiting for a seat in the fair queue, by priority class",
    ),
    (
        "gauge",
        "obleth.capacity.limit",
        _limit,
        "{request}",
        "the effective limit on requests in flight",
    ),
    (
        "gauge",
        "obleth.capacity.provider_limit",
        _provider_limits,
        "{request}",
        "each capacity provider's own limit (the effective one is the lowest)",
    ),
    (
        "counter",
        "obleth.requests",
        _requests,
        "{request}",
        "requests by how they ended (outcome) and why (reason), per tenant (the most "
        "active by name, the rest as other) and priority class",
    ),
    (
        "gauge",
        "obleth.upstream.in_flight",
        _upstream_in_flight,
        "{request}",
        "requests this gateway routed to the upstream and has not finished",
    ),
    (
        "gauge",
        "obleth.upstream.healthy",
        _upstream_healthy,
        "",
        "1 while the upstream passes its health checks, else 0",
    ),
    (
        "counter",
        "obleth.upstream.requests",
        _upstream_requests,
        "{request}",
        "requests the proxy sent to the upstream, by the status it answered (error: no answer)",
    ),
    (
        "counter",
        "obleth.routing.decisions",
        _routing_decisions,
        "{request}",
        "upstreams chosen by the router, by kind (routed; rerouted after a failure)",
    ),
    # cluster mode only: the pod's link to the shared budget (docs/cluster.md). They used
    # to be registered by each Redis backend with the global provider: a second gateway's
    # were dropped as duplicates, and a gateway gone kept reporting its pod
    (
        "gauge",
        "obleth.cluster.degraded",
        _cluster_degraded,
        "",
        "1 while Redis is unreachable and the failure mode decides admission",
    ),
    (
        "gauge",
        "obleth.cluster.local_share",
        _cluster_local_share,
        "{request}",
        "seats this pod admits on its own in local failure mode",
    ),
    (
        "counter",
        "obleth.cluster.leases_reasserted",
        _cluster_reasserted,
        "{lease}",
        "leases this pod wrote back after Redis lost them or let them expire",
    ),
)
