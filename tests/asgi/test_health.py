"""The probes mounted around ``GatewayMiddleware`` by an application (not ``obleth serve``):
health and readiness answered by the gateway, never queued, and ``/metrics`` left to the
app when no metrics are given."""

from __future__ import annotations

import asyncio

from gateway import GatewayMiddleware, Settings
from gateway.admin import Probes
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
    """Without upstreams, /readyz says ready once the gateway started, and not ready once
    80 % of max_queue waits; /healthz stays alive throughout, even with every seat taken."""

    async def scenario() -> None:
        middleware = GatewayMiddleware(
            slow_app, Settings(global_max_in_flight=1, max_queue=5, queue_timeout_s=3600)
        )
        probes = Probes(middleware, middleware.gateway)
        unstarted = await get(probes, "/readyz")
        assert unstarted.status == 503
        assert unstarted.json()["not_ready"] == ["the gateway has not started"]
        await middleware.gateway.start()
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
