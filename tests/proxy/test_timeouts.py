"""The response and read timeouts, against upstreams that go quiet, over real servers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp, proxy_to
from gateway.sim import SimConfig, create_app
from tests.proxy.upstreams import (
    FakeRoute,
    Gated,
    Stalling,
    read_cut_short,
    routed,
    within,
)

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.2


async def test_no_response_headers_within_the_response_timeout_is_a_504(
    http: httpx.AsyncClient,
) -> None:
    """An OpenAI-style 504 ``upstream_timeout``, and the upstream sees the request dropped."""
    stalling = Stalling()
    async with (
        serve_in_task(stalling, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url, response_timeout_s=TIMEOUT_S)) as proxy,
    ):
        response = await http.post(f"{proxy.url}/v1/completions", json={"prompt": "hi"})
        await within(stalling.left.wait(), "the upstream seeing the proxy leave")

    assert response.status_code == 504
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("upstream_timeout", "server_error")
    assert error["message"]


@contextlib.asynccontextmanager
async def not_reading_bodies() -> AsyncIterator[str]:
    """The base URL of an upstream that reads a request's head, never its body, and never
    answers; small receive buffers, so that a body of a few MiB fills them."""
    connections: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(accept, sock=listener)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        for writer in connections:
            writer.close()
        server.close()


async def test_an_upstream_that_stops_taking_the_body_is_answered_504_in_time(
    http: httpx.AsyncClient,
) -> None:
    """Writing into an upstream that reads nothing would wait for ever: the response
    timeout bounds it too (here for a body the proxy already holds whole, 12 MiB)."""
    async with not_reading_bodies() as url:
        app = ProxyApp(response_timeout_s=TIMEOUT_S, retry_body_bytes=16 * 1024 * 1024)
        async with serve_in_task(routed(app, FakeRoute(url))) as proxy:
            response = await within(
                http.post(f"{proxy.url}/v1/upload", content=b"x" * (12 * 1024 * 1024)),
                "the proxy answering while its upstream reads nothing",
            )

    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


async def test_a_response_timeout_is_not_retried_on_the_next_upstream(
    http: httpx.AsyncClient,
) -> None:
    """The slow upstream may still be working on it: 504, and nothing sent elsewhere."""
    stalling, sim = Stalling(), create_app(SimConfig())
    async with serve_in_task(stalling, lifespan="off") as slow, serve_in_task(sim) as healthy:
        route = FakeRoute(slow.url, healthy.url)
        app = ProxyApp(response_timeout_s=TIMEOUT_S)
        async with serve_in_task(routed(app, route)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json={"prompt": "hi"})

    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert route.reroutes == 0
    assert sim.state.stats.snapshot().requests == 0


async def test_the_response_timeout_stops_counting_once_the_headers_arrived(
    http: httpx.AsyncClient,
) -> None:
    """A stream may pause for longer than the response timeout after it started."""
    gated = Gated()
    async with (
        serve_in_task(gated, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url, response_timeout_s=TIMEOUT_S)) as proxy,
        http.stream("POST", f"{proxy.url}/v1/completions", json={"stream": True}) as response,
    ):
        assert response.status_code == 200
        chunks = response.aiter_raw()
        first = await within(anext(chunks), "the first event")
        await asyncio.sleep(3 * TIMEOUT_S)
        gated.release.set()
        rest = b"".join([chunk async for chunk in chunks])

    assert first + rest == Gated.EVENTS


async def test_silence_mid_stream_longer_than_the_read_timeout_cuts_the_response_short(
    http: httpx.AsyncClient,
) -> None:
    """The status is sent: the client sees a truncated body, the upstream the disconnect."""
    stalling = Stalling(first_chunk=b"data: 1\n\n")
    async with (
        serve_in_task(stalling, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url, read_timeout_s=TIMEOUT_S)) as proxy,
        http.stream("POST", f"{proxy.url}/v1/completions", json={"stream": True}) as response,
    ):
        assert response.status_code == 200
        assert await read_cut_short(response) == b"data: 1\n\n"
        await within(stalling.left.wait(), "the upstream seeing the proxy leave")


async def test_the_read_timeout_bounds_each_pause_not_the_whole_stream(
    http: httpx.AsyncClient,
) -> None:
    """A stream of 50 tokens 10 ms apart lasts longer than the read timeout, and is whole."""
    sim = create_app(SimConfig(step_s=0.01, step_s_per_seq=0.0, prefill_s_per_token=0.0))
    body = {"prompt": "Count slowly.", "max_tokens": 50, "stream": True}
    async with (
        serve_in_task(sim) as upstream,
        serve_in_task(proxy_to(upstream.url, read_timeout_s=0.3)) as proxy,
    ):
        response = await http.post(f"{proxy.url}/v1/completions", json=body)

    assert response.status_code == 200
    assert response.text.count("data: ") == 51 and response.text.endswith("data: [DONE]\n\n")
    assert sim.state.stats.snapshot().completed == 1
