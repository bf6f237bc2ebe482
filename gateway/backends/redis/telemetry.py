"""What a pod tells OpenTelemetry about its link to the shared budget.

The gauges read the backend when a reader collects, so they cost nothing per request.
Without an OpenTelemetry SDK configured by the application they are no-ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

if TYPE_CHECKING:
    from gateway.backends.redis.backend import RedisBackend


def observe(backend: RedisBackend, provider: MeterProvider | None = None) -> None:
    """Register this backend's gauges with ``provider`` (default: the global one).

    - ``obleth.cluster.degraded``: 1 while Redis is unreachable and
      ``redis_failure_mode`` decides (attribute ``mode``), else 0;
    - ``obleth.cluster.local_share``: seats this pod may hold on its own in ``local``
      mode (``limit / live pods``), 0 otherwise;
    - ``obleth.cluster.leases_reasserted``: leases this pod had to write back since it
      started (Redis lost them, or the pod was cut off past the lease TTL).
    """
    meter = metrics.get_meter("obleth", meter_provider=provider)
    attributes = {"pool": backend.pool_name, "pod": backend.pod}

    def degraded(options: CallbackOptions) -> Iterable[Observation]:
        mode = backend.mode
        value = 0 if mode == "redis" else 1
        return [Observation(value, {**attributes, "mode": mode})]

    def local_share(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(backend.local_share, attributes)]

    def reasserted(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(backend.reasserted, attributes)]

    meter.create_observable_gauge(
        "obleth.cluster.degraded",
        callbacks=[degraded],
        description="1 while Redis is unreachable and the failure mode decides admission",
    )
    meter.create_observable_gauge(
        "obleth.cluster.local_share",
        callbacks=[local_share],
        description="seats this pod admits on its own in local failure mode",
    )
    meter.create_observable_counter(
        "obleth.cluster.leases_reasserted",
        callbacks=[reasserted],
        description="leases this pod wrote back after Redis lost them or let them expire",
    )
