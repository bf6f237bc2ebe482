"""Requests on exempt paths in ``obleth serve``: forwarded to an upstream like any other,
without a seat. The app ``obleth serve`` builds (``build_app``) is served by real uvicorn
on loopback in front of simulated upstreams, each serving its own model."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.cli.serve import build_app
from gateway.gateway import Gateway
from gateway.loopback import serve_in_task
from gateway.settings import Settings
from tests.routing.test_routed_requests import (
    ENDLESS,
    FAST,
    SHORT,
    UPSTREAM_HEADER,
    Sim,
    simulators,
)

pytestmark = pytest.mark.anyio

WAIT_S = 10.0


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[tuple[str, Gateway, Sim, Sim]]:
    """``obleth serve``'s app in front of two upstreams, serving model-a and model-b; the
    gateway admits one request at a time and refuses the next at once."""
    async with contextlib.AsyncExitStack() as stack:
        a, b = [
            (await stack.enter_async_context(simulators(1, dataclasses.replace(FAST, model=m))))[0]
            for m in ("model-a", "model-b")
        ]
        options = {
            "upstreams": (f"{a.url}=model-a", f"{b.url}=model-b"),
            "global_max_in_flight": 1,
            "overflow_policy": "reject",
            "upstream_header": True,
            **settings,
        }
        app = build_app(Settings(**options))
        server = await stack.enter_async_context(serve_in_task(app))
        gateway = app.gateway
        yield server.url, gateway, a, b


def in_flight(gateway: Gateway) -> dict[str, int]:
    assert gateway.router is not None
    return dict(gateway.router.in_flight())


async def idle(gateway: Gateway) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if not any(in_flight(gateway).values()) and gateway.snapshot().inflight == 0:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"still in flight after {WAIT_S} s: {in_flight(gateway)}")


async def test_a_request_on_an_exempt_path_is_forwarded_to_an_upstream_serving_its_model() -> None:
    """With ``/v1/completions`` exempt, its requests reach the upstream that serves their
    model while the only seat is held by another request (they take none), each counts in
    flight on its upstream until it has answered, and a model nobody serves gets the 404
    an admitted request would. They used to be answered 503 ``no_upstream``: the proxy
    had nowhere to send them."""
    exempt = ("/healthz", "/v1/completions")
    async with (
        served(exempt_paths=exempt) as (url, gateway, a, b),
        httpx.AsyncClient(trust_env=False, timeout=WAIT_S) as http,
    ):
        chat = {**ENDLESS, "model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
        async with http.stream("POST", f"{url}/v1/chat/completions", json=chat) as held:
            assert held.status_code == 200
            refused = await http.post(f"{url}/v1/chat/completions", json=chat)
            answers = [
                await http.post(f"{url}/v1/completions", json={**SHORT, "model": model})
                for model in ("model-a", "model-b", "model-b")
            ]
            unserved = await http.post(f"{url}/v1/completions", json={**SHORT, "model": "model-c"})
            seats_held = gateway.snapshot().inflight
        await idle(gateway)

    assert refused.status_code == 503  # the seat was taken
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert [r.headers[UPSTREAM_HEADER] for r in answers] == [a.url, b.url, b.url]
    assert [r.json()["model"] for r in answers] == ["model-a", "model-b", "model-b"]
    assert (a.stats().completed, b.stats().completed) == (1, 2)
    assert unserved.status_code == 404
    assert unserved.json()["error"]["code"] == "model_not_found"
    assert seats_held == 1  # the held stream's, and none of the exempt requests'


async def test_an_exempt_request_over_max_body_bytes_is_refused_413_and_reaches_no_upstream() -> (
    None
):
    """The body read to find the model is bounded as an admitted request's is."""
    async with (
        served(exempt_paths=("/v1/completions",), max_body_bytes=1024) as (url, gateway, a, b),
        httpx.AsyncClient(trust_env=False, timeout=WAIT_S) as http,
    ):
        body = {**SHORT, "model": "model-a", "prompt": "x" * 4096}
        response = await http.post(f"{url}/v1/completions", json=body)
        await idle(gateway)

    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]["message"]
    assert a.stats().completed == b.stats().completed == 0
