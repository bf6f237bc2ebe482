"""Upstream answers a client could not read as they came: a ``304`` that names the length
of the body it stands for, a ``101`` nobody asked for, and a status HTTP does not
define, each relayed as a client can read it."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp
from tests.proxy.upstreams import WAIT_S, FakeRoute, raw_upstream, routed

pytestmark = pytest.mark.anyio

ANSWERS = {
    # RFC 9110, 8.6: a 304 may carry the Content-Length of the representation
    b"/not-modified": b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\nContent-Length: 42\r\n\r\n',
    b"/upgraded": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\n\r\n",
    b"/fine": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"/weird": b"HTTP/1.1 999 Weird\r\nContent-Length: 2\r\n\r\nok",
}


async def answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request with ``ANSWERS`` for its path, on a kept-alive connection."""
    try:
        async with asyncio.timeout(WAIT_S):
            while head := await reader.readuntil(b"\r\n\r\n"):
                writer.write(ANSWERS[head.split(b" ")[1]])
                await writer.drain()
    except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


async def test_a_304_with_a_content_length_is_relayed_whole(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The client gets its 304 and the connection stays usable; the server used to wait
    for the 42 bytes the header named, and log the app's response as broken."""
    async with (
        raw_upstream(answering) as upstream,
        serve_in_task(routed(ProxyApp(), FakeRoute(upstream))) as proxy,
    ):
        with caplog.at_level(logging.ERROR):
            first = await http.get(f"{proxy.url}/not-modified")
            second = await http.get(f"{proxy.url}/fine")
    assert first.status_code == 304 and first.content == b""
    assert (second.status_code, second.text) == (200, "ok")
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]


async def test_a_101_nobody_asked_for_is_a_bad_response(http: httpx.AsyncClient) -> None:
    """The gateway upgrades no connection (it refuses websockets): a 101 is an upstream
    that answered nonsense, ``502 upstream_bad_response``. It used to reach the client
    as a final response with a chunked body, which no client can read."""
    async with (
        raw_upstream(answering) as upstream,
        serve_in_task(routed(ProxyApp(), FakeRoute(upstream))) as proxy,
    ):
        answer = await http.get(f"{proxy.url}/upgraded")
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_bad_response"


async def test_a_status_http_does_not_define_is_a_bad_response(http: httpx.AsyncClient) -> None:
    """A status past 599 cannot be passed on (the server has no status line for it): it is
    an upstream that answered nonsense, ``502 upstream_bad_response``, and the proxy
    stays usable. The client's connection used to be dropped without an answer."""
    async with (
        raw_upstream(answering) as upstream,
        serve_in_task(routed(ProxyApp(), FakeRoute(upstream))) as proxy,
    ):
        answer = await http.get(f"{proxy.url}/weird")
        then = await http.get(f"{proxy.url}/fine")
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_bad_response"
    assert (then.status_code, then.text) == (200, "ok")
