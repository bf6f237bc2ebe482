"""The poller's HTTP client against real servers on loopback: keep-alive, framing, failures."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.loopback import serve_in_task
from gateway.routing.scraper import IDLE_KEPT, Scraper, Unanswered
from gateway.types import Receive, Scope, Send

pytestmark = pytest.mark.anyio

TIMEOUT_S = 5.0
"""Only a safety net: no test but the one about timeouts expects a request to take long."""

MAX_BODY = 1024

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    """A TCP server on 127.0.0.1 that answers as the test writes it, byte for byte.

    ``handler(reader, writer, n)`` serves the n-th connection (from 0) and the server
    closes it when the handler returns. ``connections`` counts those accepted.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n, self.connections = self.connections, self.connections + 1
        try:
            await self.handler(reader, writer, n)
        except ConnectionError:
            pass  # the client went away: its side of the test says what that means
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw(handler: Handler) -> AsyncIterator[RawServer]:
    server = RawServer(handler)
    listening = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listening.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TIMEOUT_S):
                await listening.wait_closed()


async def request_of(reader: asyncio.StreamReader) -> bytes:
    """One request's head (a GET has no body), or b"" when the client closed instead."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""


def answer(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
    return head + extra + b"\r\n" + body


def scraper_for(url: str, *, timeout_s: float = TIMEOUT_S) -> Scraper:
    return Scraper(url, timeout_s=timeout_s, max_body_bytes=MAX_BODY)


class Clients:
    """An ASGI app that answers ``ok`` and remembers the client address of each request."""

    def __init__(self) -> None:
        self.addresses: list[object] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.addresses.append(scope["client"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_requests_share_one_kept_alive_connection() -> None:
    """Rounds after the first open no connection: the upstream sees one client address."""
    app = Clients()
    async with serve_in_task(app, lifespan="off") as server:
        scraper = scraper_for(server.url)
        try:
            bodies = [await scraper.get(f"{server.url}/metrics") for _ in range(5)]
        finally:
            scraper.close()

    assert bodies == [b"ok"] * 5
    assert len(set(app.addresses)) == 1


async def test_two_requests_at_once_take_two_connections_and_both_are_kept() -> None:
    """A round's metrics and health requests run side by side, then both connections stay."""
    app = Clients()
    async with serve_in_task(app, lifespan="off") as server:
        scraper = scraper_for(server.url)
        try:
            for _ in range(3):
                await asyncio.gather(
                    scraper.get(f"{server.url}/metrics"), scraper.get(f"{server.url}/health")
                )
        finally:
            scraper.close()

    assert len(set(app.addresses)) == IDLE_KEPT == 2


async def test_chunked_and_close_delimited_bodies_are_read_whole() -> None:
    """A body in chunks, and one that ends where the upstream closes, arrive entire."""

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request_of(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"4\r\nvllm\r\n1\r\n:\r\n0\r\n\r\n")
        await writer.drain()
        await request_of(reader)

    async def until_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await request_of(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nvllm:")
        await writer.drain()

    for handler in (chunked, until_close):
        async with raw(handler) as server:
            scraper = scraper_for(server.url)
            try:
                assert await scraper.get(f"{server.url}/metrics") == b"vllm:"
            finally:
                scraper.close()


async def test_a_status_other_than_2xx_is_unanswered_and_names_it() -> None:
    """A redirect is not followed: it is an answer other than 2xx, like a 503."""

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await request_of(reader):
            writer.write(answer(b"", status="302 Found", extra=b"Location: /elsewhere\r\n"))
            await writer.drain()

    async with raw(redirect) as server:
        scraper = scraper_for(server.url)
        try:
            with pytest.raises(
                Unanswered, match=r"GET http://127\.0\.0\.1:\d+/health: answered 302"
            ):
                await scraper.get(f"{server.url}/health")
        finally:
            scraper.close()


async def test_a_body_over_the_limit_is_refused_and_its_connection_closed() -> None:
    """A metrics page larger than ``max_body_bytes`` is no answer; the connection goes."""
    closed = asyncio.Event()

    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request_of(reader)
        writer.write(answer(b"x" * (MAX_BODY + 1)))
        await writer.drain()
        if not await request_of(reader):
            closed.set()

    async with raw(huge) as server:
        scraper = scraper_for(server.url)
        try:
            with pytest.raises(Unanswered, match=f"body over {MAX_BODY} bytes"):
                await scraper.get(f"{server.url}/metrics")
            async with asyncio.timeout(TIMEOUT_S):
                await closed.wait()
        finally:
            scraper.close()


async def test_an_answer_that_is_not_http_is_unanswered() -> None:
    """Bytes that do not parse as an HTTP/1.x response fail the request, never hang it."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request_of(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await request_of(reader)

    async with raw(garbage) as server:
        scraper = scraper_for(server.url)
        try:
            with pytest.raises(Unanswered, match=re.escape("not an HTTP/1.x answer")):
                await scraper.get(f"{server.url}/metrics")
        finally:
            scraper.close()


async def test_an_upstream_that_never_answers_times_out() -> None:
    """No answer within ``timeout_s`` is a failure that says how long it waited."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request_of(reader)
        await request_of(reader)  # until the client gives up and closes

    async with raw(silent) as server:
        scraper = scraper_for(server.url, timeout_s=0.05)
        try:
            with pytest.raises(Unanswered, match=re.escape("no answer within 0.05 s")):
                await scraper.get(f"{server.url}/metrics")
        finally:
            scraper.close()


async def test_nothing_listening_is_unanswered() -> None:
    """A refused connection is a failure naming the URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    scraper = scraper_for(url)
    with pytest.raises(Unanswered, match=f"GET {url}/health: cannot connect"):
        await scraper.get(f"{url}/health")


async def test_a_kept_connection_the_upstream_dropped_is_replaced_without_a_failure() -> None:
    """An idle connection closed by the upstream as the next request goes out is no
    verdict on the upstream: the request is sent again on a new connection."""

    async def one_answer_each(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await request_of(reader)
        # kept alive, as far as the client can tell...
        writer.write(answer(b"ok"))
        await writer.drain()
        # ...until the next request, which the upstream drops unanswered
        await request_of(reader)

    async with raw(one_answer_each) as server:
        scraper = scraper_for(server.url)
        try:
            bodies = [await scraper.get(f"{server.url}/health") for _ in range(3)]
        finally:
            scraper.close()

    assert bodies == [b"ok"] * 3
    assert server.connections == 3


async def test_close_closes_the_kept_connections() -> None:
    """After ``close()`` the upstream sees its connections end; a later request opens one."""
    ended = asyncio.Event()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await request_of(reader):
            writer.write(answer(b"ok"))
            await writer.drain()
        ended.set()

    async with raw(keep) as server:
        scraper = scraper_for(server.url)
        await scraper.get(f"{server.url}/health")
        scraper.close()
        async with asyncio.timeout(TIMEOUT_S):
            await ended.wait()
        assert await scraper.get(f"{server.url}/health") == b"ok"
        scraper.close()

    assert server.connections == 2


async def test_a_url_on_another_origin_is_refused() -> None:
    """A scraper speaks to the one upstream it was made for."""
    scraper = scraper_for("http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="not on the origin"):
        await scraper.get("http://127.0.0.1:8001/metrics")
