"""contrib/grafana/obleth.json queries only metrics and label values a real gateway exports."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.loopback import serve_in_thread
from gateway.routing.promtext import parse_samples
from gateway.telemetry.sdk import PrometheusExport
from tests.cluster.pods import ServePod
from tests.proxy.serving import serving
from tests.proxy.upstreams import Echo, eventually, within
from tests.redis_procs import RedisServer

DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "obleth.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# the gateway's metric names, as the exposition page spells them (suffixes included)
_METRIC = re.compile(r"\b(?:obleth_[a-z_]+|target_info)\b")
# a metric with its label matchers: `name{label="value", ...}`
_SELECTOR = re.compile(r"\b(obleth_[a-z_]+|target_info)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
# every sample line's name: the first token of a line that is not a comment
_SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels_of(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels a collapsed row keeps inside it."""
    for panel in panels:
        yield panel
        yield from panels_of(panel.get("panels", []))


def expressions_of(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets' and query variables'."""
    found = [
        target["expr"]
        for panel in panels_of(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def literal_matchers(expr: str) -> set[tuple[str, str, str]]:
    """``(metric, label, value)`` of each ``label="value"`` matcher that names a fixed
    value: not a template variable, not a regular expression or a negation."""
    found: set[tuple[str, str, str]] = set()
    for metric, matchers in _SELECTOR.findall(expr):
        for label, op, value in _MATCHER.findall(matchers):
            if op == "=" and "$" not in value:
                found.add((metric, label, value))
    return found


def missing(dashboard: dict[str, Any], page: str) -> list[str]:
    """What the dashboard asks for that ``page`` (Prometheus text) lacks: metric names, and
    fixed label values no sample of that metric carries."""
    exported = set(_SAMPLE_NAME.findall(page))
    exprs = expressions_of(dashboard)
    lacking = sorted({name for expr in exprs for name in metric_names(expr)} - exported)
    for metric, label, value in sorted({m for expr in exprs for m in literal_matchers(expr)}):
        if not any(s.labels.get(label) == value for s in parse_samples(page, [metric])):
            lacking.append(f'{metric}{{{label}="{value}"}}')
    return lacking


async def in_process_page() -> str:
    """``/metrics`` of ``obleth serve``'s app after one seat was held, one request waited
    for it, one found the queue full and two completed (as in
    tests/proxy/test_metrics_endpoint.py): requests by outcome, the queue-wait histogram,
    upstream answers and routing decisions all have samples."""
    async with (
        serving(
            PrometheusExport(), global_max_in_flight=1, max_queue=1, overflow_policy="drop-newest"
        ) as served,
        httpx.AsyncClient(base_url=served.url, trust_env=False) as http,
    ):
        gateway = served.app.gateway
        holding = asyncio.ensure_future(http.get("/hold"))
        await eventually(lambda: gateway.snapshot().inflight == 1, "the seat held")
        waiting = asyncio.ensure_future(http.get("/version"))
        await eventually(lambda: gateway.snapshot().queued == 1, "a request waiting")
        assert (await http.get("/version")).status_code == 503
        served.echo.release.set()
        assert (await within(holding, "the held request's answer")).status_code == 200
        assert (await within(waiting, "the waiting request's answer")).status_code == 200
        return (await http.get("/metrics")).text


def cluster_page(redis: RedisServer) -> str:
    """``/metrics`` of ``obleth serve --redis-url`` after one request: the cluster gauges,
    which the gateway's instruments report for its Redis backend, are on it."""
    pool = f"t-{secrets.token_hex(6)}"
    args = ["--redis-url", redis.url, "--pool", pool]
    with (
        serve_in_thread(Echo(), lifespan="off") as upstream,
        ServePod([upstream.url], args=args, name="grafana-cluster") as pod,
        httpx.Client(base_url=pod.url, trust_env=False) as http,
    ):
        assert http.get("/version").status_code == 200
        response = http.get("/metrics")
    assert response.status_code == 200, response.text
    return response.text


@pytest.fixture(scope="module")
def page(redis_server: RedisServer) -> str:
    """Two real gateways' pages as one: in process, and in cluster mode."""
    return asyncio.run(in_process_page()) + "\n" + cluster_page(redis_server)


def test_dashboard_is_grafana_json_whose_panels_all_read_the_chosen_prometheus() -> None:
    """Imported as is, the dashboard asks for a Prometheus data source and a pool, and
    every panel and query reads that data source; panel ids are unique."""
    dashboard = load_dashboard()
    assert (dashboard["uid"], dashboard["title"]) == ("obleth", "Obleth")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    assert variables["pool"]["datasource"] == DATASOURCE
    assert "label_values(obleth_capacity_limit, pool)" in expressions_of(dashboard)
    panels = list(panels_of(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_every_metric_and_label_value_the_dashboard_queries_is_on_a_gateways_page(
    page: str,
) -> None:
    """A panel never stays empty because of a misspelt or renamed metric: every name the
    expressions use, and every fixed label value they match, is on a real gateway's
    ``/metrics``."""
    dashboard = load_dashboard()
    assert {name for expr in expressions_of(dashboard) for name in metric_names(expr)} >= {
        "obleth_in_flight",
        "obleth_queue_wait_seconds_bucket",
        "obleth_cluster_degraded",
    }
    assert missing(dashboard, page) == []


def test_a_metric_or_label_value_the_gateway_does_not_export_is_reported_missing(
    page: str,
) -> None:
    """The check above can fail: a made-up metric and a made-up outcome in a copy of the
    dashboard are named as missing, and nothing else is."""
    dashboard = copy.deepcopy(load_dashboard())
    panel = next(p for p in panels_of(dashboard["panels"]) if p.get("targets"))
    made_up = [
        "sum(rate(obleth_nonexistent_total[$__rate_interval]))",
        'sum(rate(obleth_requests_total{pool="$pool", outcome="vanished"}[5m]))',
    ]
    panel["targets"] += [{"expr": expr, "refId": f"Z{i}"} for i, expr in enumerate(made_up)]
    assert missing(dashboard, page) == [
        "obleth_nonexistent_total",
        'obleth_requests_total{outcome="vanished"}',
    ]
