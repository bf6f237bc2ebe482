"""Kept-alive connections to upstreams are reused only while they are quiet: bytes an
upstream sends unasked, between two requests, are never read as the answer to the next
request on that connection (another client's)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp
from tests.proxy.upstreams import WAIT_S, FakeRoute, raw_upstream, routed

pytestmark = pytest.mark.anyio

UNASKED = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Unasked: yes\r\n\r\nUNASKED!"


class Chatty:
    """A raw upstream answering each request ``answer-<n>`` on a kept-alive connection;
    after its first answer it also sends a whole second response nobody asked for, as a
    buggy server might (a duplicate, or another request's late answer)."""

    def __init__(self) -> None:
        self.requests = 0
        self.connections = 0
        self.spoken = asyncio.Event()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            async with asyncio.timeout(WAIT_S):
                while await reader.readuntil(b"\r\n\r\n"):
                    self.requests += 1
                    body = b"answer-%d" % self.requests
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                    await writer.drain()
                    if self.requests == 1:
                        await asyncio.sleep(0.05)  # the proxy has its whole answer by now
                        writer.write(UNASKED)
                        await writer.drain()
                        self.spoken.set()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def serving(self) -> contextlib.AbstractAsyncContextManager[str]:
        return raw_upstream(self.accept)


async def test_an_upstream_that_spoke_unasked_is_not_reused_for_the_next_request(
    http: httpx.AsyncClient,
) -> None:
    """The second request gets the upstream's answer to it, over a new connection; it
    used to get ``UNASKED!``, left in the pooled connection after the first."""
    chatty = Chatty()
    async with (
        chatty.serving() as upstream,
        serve_in_task(routed(ProxyApp(), FakeRoute(upstream))) as proxy,
    ):
        first = await http.get(f"{proxy.url}/v1/a")
        await asyncio.wait_for(chatty.spoken.wait(), WAIT_S)
        await asyncio.sleep(0.05)  # the unasked bytes reach the idle connection
        second = await http.get(f"{proxy.url}/v1/b")

    assert (first.status_code, first.text) == (200, "answer-1")
    assert (second.status_code, second.text) == (200, "answer-2")
    assert "x-unasked" not in second.headers
    assert chatty.connections == 2


class HalfOpen:
    """A raw upstream that answers each request after ``delay_s`` on a kept-alive
    connection, and keeps a connection open after the proxy ended its side of it (a
    server that supports half-open connections), answering all the same."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.connections = 0
        self.answered = 0
        self.eofs = 0

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            async with asyncio.timeout(WAIT_S):
                while True:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError:
                        self.eofs += 1
                        await asyncio.sleep(WAIT_S)  # half-open: ours stays open
                        return
                    length = 0
                    for line in head.split(b"\r\n"):
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    await reader.readexactly(length)
                    await asyncio.sleep(self.delay_s)
                    body = b"answer-%d" % (self.answered + 1)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                    await writer.drain()
                    self.answered += 1
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_connection_ended_for_a_client_that_left_is_never_reused(
    http: httpx.AsyncClient,
) -> None:
    """A client gives up before the answer: the proxy ends its side of the upstream
    connection, and the upstream, keeping its own open, answers all the same. That
    connection used to go back to the pool, and the next client's request, written to
    it, failed with a 502; it is now closed, and the next request gets a new one."""
    upstream = HalfOpen(delay_s=0.3)
    async with (
        raw_upstream(upstream.accept) as url,
        serve_in_task(routed(ProxyApp(), FakeRoute(url))) as proxy,
    ):
        with pytest.raises(httpx.TimeoutException):
            await http.post(f"{proxy.url}/v1/completions", json={"prompt": "a"}, timeout=0.05)
        for _ in range(200):  # the upstream answers the request no one waits for any more
            if upstream.answered:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and the proxy has read that answer, for no one
        second = await http.post(f"{proxy.url}/v1/completions", json={"prompt": "b"})

    assert upstream.eofs >= 1  # the upstream was told the client left
    assert (second.status_code, second.text) == (200, "answer-2")
    assert upstream.connections == 2
