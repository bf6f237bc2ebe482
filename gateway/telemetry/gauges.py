"""The gateway's gauges: seats in flight, requests queued and the capacity limit.

They read ``Gateway.snapshot()`` when a metric reader collects (a Prometheus scrape), so
they cost nothing per request. OpenTelemetry API only: where the numbers go is the meter
provider's business.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from gateway.gateway import Gateway
from gateway.protocols import Snapshot

_Callback = Callable[[CallbackOptions], Iterable[Observation]]


def observe_gateway(gateway: Gateway, provider: MeterProvider | None = None) -> None:
    """Register ``gateway``'s gauges with ``provider`` (default: the global one).

    - ``obleth.in_flight``: seats held by admitted requests;
    - ``obleth.queue_depth``: requests waiting for a seat;
    - ``obleth.capacity.limit``: the effective limit on requests in flight.

    Each carries the attribute ``pool``. The figures are the snapshot's: this process's
    own without ``redis_url``; in cluster mode, the pool's as of this pod's last reply
    from Redis. The gauges hold ``gateway`` weakly and report nothing once it is gone.
    """
    meter = metrics.get_meter("obleth", meter_provider=provider)
    attributes = {"pool": gateway.settings.pool}
    held = weakref.ref(gateway)

    def gauge(read: Callable[[Snapshot], int]) -> _Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            current = held()
            if current is None:
                return []
            return [Observation(read(current.snapshot()), attributes)]

        return observe

    meter.create_observable_gauge(
        "obleth.in_flight",
        callbacks=[gauge(lambda snapshot: snapshot.inflight)],
        unit="{request}",
        description="seats held by admitted requests",
    )
    meter.create_observable_gauge(
        "obleth.queue_depth",
        callbacks=[gauge(lambda snapshot: snapshot.queued)],
        unit="{request}",
        description="requests waiting for a seat in the fair queue",
    )
    meter.create_observable_gauge(
        "obleth.capacity.limit",
        callbacks=[gauge(lambda snapshot: snapshot.limit)],
        unit="{request}",
        description="the effective limit on requests in flight",
    )
