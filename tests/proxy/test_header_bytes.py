"""Headers through the proxy as bytes: a request's reach the upstream as the client sent
them, and a response's are read up to the bound on request heads, over real servers."""

from __future__ import annotations

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import proxy_to
from gateway.types import Receive, Scope, Send
from tests.proxy.upstreams import Answering, Echo, header_values, proxy_over, read_body

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "value",
    ["café".encode(), "Jürgen's 🦙 ünïcödé".encode(), b"plain ascii"],
    ids=["accent", "emoji", "ascii"],
)
async def test_a_utf8_request_header_reaches_the_upstream_byte_for_byte(
    http: httpx.AsyncClient, value: bytes
) -> None:
    """``X-Title: café`` arrives as the client's bytes, b'caf\\xc3\\xa9' (it used to arrive
    re-encoded, b'caf\\xc3\\x83\\xc2\\xa9')."""
    echo = Echo()
    async with (
        serve_in_task(echo, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url)) as proxy,
    ):
        response = await http.post(f"{proxy.url}/v1/x", headers={"x-title": value}, content=b"")

    assert response.status_code == 200
    [seen] = header_values(response.json(), "x-title")
    assert seen.encode("latin-1") == value  # Echo hands back each byte as one character


async def test_an_iso_8859_1_request_header_reaches_the_upstream_as_the_same_text(
    http: httpx.AsyncClient,
) -> None:
    """``café`` as browsers' fetch and Python's requests send it, b'caf\\xe9', is no UTF-8:
    the upstream gets the same characters in UTF-8, b'caf\\xc3\\xa9', not a 4xx nor
    other characters."""
    echo = Echo()
    async with (
        serve_in_task(echo, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url)) as proxy,
    ):
        response = await http.post(
            f"{proxy.url}/v1/x", headers={"x-title": b"caf\xe9"}, content=b""
        )

    assert response.status_code == 200
    [seen] = header_values(response.json(), "x-title")
    assert seen.encode("latin-1") == "café".encode()


class LargeHeader:
    """An upstream that reads each request and answers 200 with an ``x-large`` header of
    ``size`` bytes; ``requests`` counts them."""

    def __init__(self, size: int) -> None:
        self.value = b"v" * size
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        self.requests += 1
        headers = [(b"content-type", b"application/json"), (b"x-large", self.value)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})


async def test_a_response_header_over_8190_bytes_is_relayed_and_not_retried(
    http: httpx.AsyncClient,
) -> None:
    """A complete 200 with a 9000-byte header (aiohttp's default bound is 8190 bytes)
    reaches the client whole; the POST runs once, on the first upstream (it used to be
    taken for a failure before answering, run again on the next upstream, and 502)."""
    large, other = LargeHeader(9000), Answering("other", 200)
    async with proxy_over(large, other) as (url, route):
        response = await http.post(f"{url}/v1/completions", json={"prompt": "hi"})

    assert response.status_code == 200
    assert response.headers["x-large"] == large.value.decode()
    assert response.json() == {"ok": True}
    assert (large.requests, len(other.received), route.reroutes) == (1, 0, 0)


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_a_response_head_the_proxy_cannot_read_is_a_502_and_never_retried(
    http: httpx.AsyncClient, method: str
) -> None:
    """A header line over ``max_header_bytes`` (64 KiB): the upstream answered, so the
    request ran there; the client gets 502 ``upstream_bad_response`` and the next
    upstream is not asked, whatever the method."""
    large, other = LargeHeader(70_000), Answering("other", 200)
    async with proxy_over(large, other) as (url, route):
        response = await http.request(method, f"{url}/v1/completions")

    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_bad_response"
    assert (large.requests, len(other.received), route.reroutes) == (1, 0, 0)
