"""``obleth serve`` answers ``/metrics`` itself with Prometheus text, as a scraper reads it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.loopback import serve_in_thread
from gateway.routing.promtext import parse_samples
from tests.cluster.pods import ServePod
from tests.proxy.upstreams import Echo


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
    """The cluster gauges the Redis backend registers through the OpenTelemetry API reach
    the same page: obleth serve's SDK is the process's meter provider."""
    args = ["--redis-url", redis_url, "--pool", pool_name]
    with ServePod([echo_url], args=args, name="metrics-cluster") as pod:
        text = scrape(pod).text
    assert "obleth_cluster_degraded" in text
    assert "obleth_in_flight" in text
