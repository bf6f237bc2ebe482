"""The probes mounted around ``GatewayMiddleware`` by an application (not ``obleth serve``):
health and readiness answered by the gateway, never queued, and ``/metrics`` left to the
app when no metrics are given."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from gateway import GatewayMiddleware, Settings
from gateway.admin import Probes
from gateway.loopback import serve_in_task
from gateway.types import Receive, Scope, Send
from tests.asgi.conftest import Client, http_scope


async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Holds its seat until told to finish."""
    await asyncio.sleep(3600)


async def metrics_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app metrics"})


async def get(app: Probes, path: str) -> Client:
    client = Client()
    await app(http_scope(path, "GET"), client.receive, client.send)
    return client


def test_an_application_mounts_the_probes_around_the_middleware() -> None:
    """Without upstreams, /readyz starts a gateway nobody started and says ready, and not
    ready once 80 % of max_queue waits; /healthz stays alive throughout, even with every
    seat taken."""

    async def scenario() -> None:
        middleware = GatewayMiddleware(
            slow_app, Settings(global_max_in_flight=1, max_queue=5, queue_timeout_s=3600)
        )
        probes = Probes(middleware, middleware.gateway)
        unstarted = await get(probes, "/readyz")
        assert (unstarted.status, unstarted.json()) == (200, {"healthy_upstreams": [], "queued": 0})
        assert middleware.gateway.started
        try:
            ready = await get(probes, "/readyz")
            assert (ready.status, ready.json()) == (200, {"healthy_upstreams": [], "queued": 0})
            clients = [Client() for _ in range(5)]
            tasks = [
                asyncio.create_task(probes(http_scope(), client.receive, client.send))
                for client in clients
            ]
            for _ in range(100):  # a few turns of the loop: each request queues in one
                if middleware.gateway.snapshot().queued == 4:
                    break
                await asyncio.sleep(0)
            busy = await get(probes, "/readyz")
            assert (busy.status, busy.json()["queued"]) == (503, 4)
            assert busy.json()["not_ready"] == ["the queue holds 80% of max_queue or more"]
            assert (await get(probes, "/healthz")).json() == {"status": "alive"}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await middleware.gateway.stop()

    asyncio.run(scenario())


def test_metrics_go_to_the_app_unless_the_probes_are_given_them() -> None:

    async def scenario() -> None:
        middleware = GatewayMiddleware(metrics_app, Settings())
        await middleware.gateway.start()
        try:
            assert (await get(Probes(middleware, middleware.gateway), "/metrics")).text == (
                b"app metrics"
            )
            given = Probes(middleware, middleware.gateway, lambda: b"gateway metrics\n")
            assert (await get(given, "/metrics")).text == b"gateway metrics\n"
        finally:
            await middleware.gateway.stop()

    asyncio.run(scenario())


def test_without_lifespan_the_readiness_probe_starts_the_gateway() -> None:
    """Served without lifespan (``uvicorn --lifespan off``), the gateway would start only
    with the first request it admits, which a load balancer waiting for readiness never
    sends: /readyz starts it and says ready."""

    async def scenario() -> None:
        middleware = GatewayMiddleware(metrics_app, Settings())
        app = Probes(middleware, middleware.gateway)
        try:
            async with (
                serve_in_task(app, lifespan="off") as server,
                httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
            ):
                ready = await http.get("/readyz")
                assert (ready.status_code, ready.json()) == (
                    200,
                    {"healthy_upstreams": [], "queued": 0},
                )
                assert middleware.gateway.started
        finally:
            await middleware.gateway.stop()

    asyncio.run(scenario())


def test_a_gateway_that_could_not_be_assembled_is_not_ready_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``GatewayMiddleware`` built on a running loop with a bad setting holds a gateway
    that cannot start: /readyz answers 503 JSON naming the setting (the log says it once),
    /healthz still says alive."""
    monkeypatch.setenv("OBLETH_GLOBAL_MAX_IN_FLIGHT", "-3")

    async def scenario() -> None:
        middleware = GatewayMiddleware(metrics_app)  # on the running loop: no raise here
        app = Probes(middleware, middleware.gateway)
        async with (
            serve_in_task(app, lifespan="off") as server,
            httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
        ):
            answers = [await http.get("/readyz") for _ in range(2)]
            health = await http.get("/healthz")
        for ready in answers:
            assert (ready.status_code, ready.headers["content-type"]) == (503, "application/json")
            body = ready.json()
            (reason,) = body.pop("not_ready")
            assert reason.startswith("the gateway could not start: OBLETH_GLOBAL_MAX_IN_FLIGHT=-3")
            assert body == {"healthy_upstreams": [], "queued": 0}
        assert (health.status_code, health.json()) == (200, {"status": "alive"})

    with caplog.at_level(logging.ERROR, logger="obleth"):
        asyncio.run(scenario())
    logged = [r for r in caplog.records if "could not start, so it is not ready" in r.message]
    assert len(logged) == 1 and "OBLETH_GLOBAL_MAX_IN_FLIGHT=-3" in logged[0].message


def test_under_a_root_path_probes_and_exempt_paths_are_matched_below_it() -> None:
    """Behind a proxy that strips the prefix /gw, ``uvicorn --root-path /gw`` puts it back
    into ``scope["path"]`` (/gw/healthz): the probes still answer /healthz and /readyz,
    and an exempt path of the app (/metrics, and what lies below it) still skips
    admission with admissions paused; any other path, one that only starts with an
    exempt one's letters included, is refused."""

    async def scenario() -> None:
        middleware = GatewayMiddleware(metrics_app, Settings(overflow_policy="reject"))
        middleware.gateway.set_capacity(0)  # paused: every admission-controlled path is refused
        app = Probes(middleware, middleware.gateway)
        paths = ("/healthz", "/readyz", "/metrics", "/metrics/detail", "/v1/x", "/healthzx")
        try:
            async with (
                serve_in_task(app, lifespan="off", root_path="/gw") as server,
                httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
            ):
                answers = {path: await http.get(path) for path in paths}
        finally:
            await middleware.gateway.stop()
        assert answers["/healthz"].json() == {"status": "alive"}
        assert (answers["/readyz"].status_code, answers["/readyz"].json()["queued"]) == (200, 0)
        for exempt in ("/metrics", "/metrics/detail"):
            assert (answers[exempt].status_code, answers[exempt].text) == (200, "app metrics")
        for gated in ("/v1/x", "/healthzx"):
            assert answers[gated].status_code == 503
            assert answers[gated].json()["error"]["code"] == "over_capacity"

    asyncio.run(scenario())


def test_probes_take_get_and_head_and_refuse_other_methods_with_405() -> None:
    """A probe answers GET, and HEAD with GET's status and no body; a POST (a misconfigured
    check, a stray client) is told 405 with ``Allow`` and never reaches the app."""

    async def scenario() -> None:
        middleware = GatewayMiddleware(metrics_app, Settings())
        app = Probes(middleware, middleware.gateway, lambda: b"gateway metrics\n")
        async with (
            serve_in_task(app) as server,
            httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
        ):
            for path in ("/healthz", "/readyz", "/metrics"):
                got = await http.get(path)
                head = await http.head(path)
                assert (head.status_code, head.content) == (got.status_code, b"")
                assert head.headers["content-length"] == got.headers["content-length"]
                for method in ("POST", "PUT", "DELETE"):
                    refused = await http.request(method, path)
                    assert refused.status_code == 405, (method, path)
                    assert refused.headers["allow"] == "GET, HEAD"
                    assert refused.json()["error"]["code"] == "bad_method"
            # the app's own paths keep every method
            assert (await http.post("/v1/anything")).text == "app metrics"

    asyncio.run(scenario())
