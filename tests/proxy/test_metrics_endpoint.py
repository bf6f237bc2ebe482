"""``obleth serve`` answers ``/metrics`` itself with Prometheus text, as a scraper reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gateway.loopback import serve_in_thread
from gateway.routing.promtext import parse_samples
from gateway.telemetry.sdk import PrometheusExport
from tests.cluster.pods import ServePod
from tests.proxy.serving import serving
from tests.proxy.upstreams import Echo, eventually, within


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with serve_in_thread(Echo(), lifespan="off") as server:
        yield server.url


def scrape(pod: ServePod) -> httpx.Response:
    response = httpx.get(f"{pod.url}/metrics", trust_env=False)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response


def test_obleth_serve_answers_metrics_with_the_gateways_gauges(echo_url: str) -> None:
    """Not 503 no_upstream: in flight, queue depth and the capacity limit, read from the
    gateway when scraped."""
    names = ("obleth_in_flight", "obleth_queue_depth", "obleth_capacity_limit")
    with ServePod([echo_url], args=["--max-in-flight", "7"], name="metrics") as pod:
        samples = {name: value for name, _, value in parse_samples(scrape(pod).text, names)}
    assert samples["obleth_in_flight"] == 0
    assert samples["obleth_queue_depth"] == 0
    assert samples["obleth_capacity_limit"] == 7


def test_in_cluster_mode_metrics_show_the_link_to_redis_too(
    echo_url: str, redis_url: str, pool_name: str
) -> None:
    """The cluster gauges of the gateway's Redis backend reach the same page."""
    args = ["--redis-url", redis_url, "--pool", pool_name]
    with ServePod([echo_url], args=args, name="metrics-cluster") as pod:
        text = scrape(pod).text
    assert "obleth_cluster_degraded" in text
    assert "obleth_in_flight" in text


def samples_of(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(labels), value) for _, labels, value in parse_samples(text, [name])]


def value_of(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels``."""
    found = [v for have, v in samples_of(text, name) if labels.items() <= have.items()]
    assert found, f"no sample {name} with {labels}"
    return sum(found)


@pytest.mark.anyio
async def test_metrics_count_how_requests_ended_their_waits_and_the_upstreams_answers() -> None:
    """One seat, a queue of one, drop-newest: acme holds the seat, beta waits for it,
    gamma finds the queue full. /metrics then counts two completed requests and one
    rejected (with its reason) per tenant, beta's wait in the histogram, the upstream's
    two 200s, the router's two choices, and each provider's limit."""
    export = PrometheusExport()
    async with (
        serving(
            export,
            global_max_in_flight=1,
            max_queue=1,
            overflow_policy="drop-newest",
            tenant_header="x-tenant",
        ) as served,
        httpx.AsyncClient(base_url=served.url, trust_env=False) as http,
    ):
        gateway = served.app.gateway
        holding = asyncio.ensure_future(http.get("/hold", headers={"x-tenant": "acme"}))
        await eventually(lambda: gateway.snapshot().inflight == 1, "acme holding the seat")
        waiting = asyncio.ensure_future(http.get("/version", headers={"x-tenant": "beta"}))
        await eventually(lambda: gateway.snapshot().queued == 1, "beta waiting")
        during = (await http.get("/metrics")).text
        refused = await http.get("/version", headers={"x-tenant": "gamma"})
        assert refused.status_code == 503
        served.echo.release.set()
        assert (await within(holding, "acme's answer")).status_code == 200
        assert (await within(waiting, "beta's answer")).status_code == 200
        text = (await http.get("/metrics")).text

    assert value_of(during, "obleth_queue_depth", priority="standard") == 1
    assert value_of(during, "obleth_queue_depth", priority="critical") == 0
    assert value_of(during, "obleth_upstream_in_flight") == 1
    completed = {"outcome": "completed", "reason": "", "priority": "standard"}
    assert value_of(text, "obleth_requests_total", tenant="acme", **completed) == 1
    assert value_of(text, "obleth_requests_total", tenant="beta", **completed) == 1
    rejected = {"outcome": "rejected", "reason": "queue_full"}
    assert value_of(text, "obleth_requests_total", tenant="gamma", **rejected) == 1
    assert value_of(text, "obleth_requests_total") == 3
    # beta waited for acme's seat: one wait recorded (acme and gamma were never queued)
    assert value_of(text, "obleth_queue_wait_seconds_count", priority="standard") == 1
    assert value_of(text, "obleth_queue_wait_seconds_bucket", le="+Inf") == 1
    assert value_of(text, "obleth_upstream_requests_total", status="200") == 2
    assert value_of(text, "obleth_routing_decisions_total", kind="routed") == 2
    assert value_of(text, "obleth_routing_decisions_total", kind="rerouted") == 0
    assert value_of(text, "obleth_upstream_healthy") == 1
    assert value_of(text, "obleth_upstream_in_flight") == 0
    assert value_of(text, "obleth_capacity_provider_limit", provider="static") == 1
    assert value_of(text, "obleth_capacity_limit") == 1
