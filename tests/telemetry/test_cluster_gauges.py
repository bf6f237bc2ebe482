"""The cluster gauges (``obleth_cluster_*``) on a ``/metrics`` page: one series set per
live cluster-mode gateway that the page's meter provider watches, and none for one gone."""

from __future__ import annotations

import gc

import pytest

from gateway import Gateway, Settings
from gateway.backends.redis import RedisBackend
from gateway.routing.promtext import parse_samples
from gateway.telemetry.instruments import watch
from gateway.telemetry.sdk import PrometheusExport

pytestmark = pytest.mark.anyio

CLUSTER = (
    "obleth_cluster_degraded",
    "obleth_cluster_local_share",
    "obleth_cluster_leases_reasserted_total",
)


def pods_on_page(export: PrometheusExport) -> dict[str, set[tuple[str, str]]]:
    """For each cluster metric on the page, its ``(pool, pod)`` pairs."""
    found: dict[str, set[tuple[str, str]]] = {name: set() for name in CLUSTER}
    for name, labels, value in parse_samples(export.render().decode(), CLUSTER):
        found[name].add((dict(labels)["pool"], dict(labels)["pod"]))
        assert value == 0  # Redis answers: not degraded, no local share, nothing re-asserted
    return found


async def test_cluster_gauges_report_each_live_pod_and_forget_a_gateway_gone(
    redis_url: str, pool_name: str
) -> None:
    """Two cluster-mode gateways in one process, watched by one meter provider: each pod's
    cluster gauges are on the page; once one gateway is stopped and dropped, only the
    other's remain. Each Redis backend used to register the gauges itself with the global
    provider: the second pod's were dropped as duplicates, and a pod gone stayed forever."""
    export = PrometheusExport()
    gateways = [
        Gateway(Settings(redis_url=redis_url, pool=f"{pool_name}-{n}"), entry_points=False)
        for n in ("a", "b")
    ]
    for gateway in gateways:
        watch(gateway, export.provider)
        await gateway.start()
    first, second = gateways
    pods = []
    for gateway in gateways:
        backend = gateway.backend
        assert isinstance(backend, RedisBackend)
        pods.append((gateway.settings.pool, backend.pod))
    try:
        assert pods_on_page(export) == {name: set(pods) for name in CLUSTER}
        await first.stop()
        del gateways, gateway, first, backend
        gc.collect()
        assert pods_on_page(export) == {name: {pods[1]} for name in CLUSTER}
    finally:
        await second.stop()
        export.shutdown()
