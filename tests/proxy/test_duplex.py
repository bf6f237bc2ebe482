"""A request body still streaming upstream while the upstream answers (a transcription fed
as it uploads), with the response timeout on: the body goes through whole, an upstream
that stops taking it is given up, and a client that leaves is noticed. Clients speak
HTTP by hand, so that they can read the answer while they are still sending."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import proxy_to
from tests.proxy.rawhttp import host_port
from tests.proxy.serving import serving
from tests.proxy.upstreams import WAIT_S, Duplex, eventually, within

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024

UPLOAD_HEAD = (
    b"POST /v1/audio/transcriptions HTTP/1.1\r\nhost: gateway\r\n"
    b"content-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_until(reader: asyncio.StreamReader, received: bytearray, marker: bytes) -> None:
    """Read into ``received`` until it holds ``marker``; fails the test if the connection
    closes first or ``WAIT_S`` passes."""

    async def more() -> None:
        while marker not in received:
            data = await reader.read(65536)
            if not data:
                pytest.fail(f"closed before {marker!r} came: {bytes(received[-300:])!r}")
            received.extend(data)

    await within(more(), f"waiting for {marker!r} (so far: {bytes(received[-300:])!r})")


async def read_to_close(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes the connection (a reset counts as a close)."""
    received = bytearray()
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            received.extend(data)
    return bytes(received)


async def test_a_body_streamed_while_the_upstream_answers_reaches_it_whole() -> None:
    """The upstream answers at once and sends an event per chunk it reads; the client
    sends each chunk only once the event for the one before came back through the proxy.
    Every chunk written after the answer started goes through (it used to stop at the
    first one: the body's writer failed on a response timeout that was already over)."""
    duplex = Duplex()
    async with (
        serve_in_task(duplex, lifespan="off") as upstream,
        serve_in_task(proxy_to(upstream.url, response_timeout_s=WAIT_S)) as proxy,
    ):
        reader, writer = await asyncio.open_connection(*host_port(proxy.url))
        try:
            writer.write(UPLOAD_HEAD)
            received = bytearray()
            for n in range(1, 4):
                writer.write(chunk(b"x" * 1000))
                await read_until(reader, received, b"data: got %d\n\n" % (1000 * n))
            writer.write(LAST_CHUNK)
            await read_until(reader, received, b"data: [DONE]\n\n")
            await read_until(reader, received, b"\r\n0\r\n\r\n")  # the response's own end
        finally:
            writer.close()

    assert received.startswith(b"HTTP/1.1 200 ")
    assert duplex.received == 3000


class TakingNoBody:
    """A raw upstream that reads a request's head, answers 200 with one event at once, and
    then reads nothing, until ``drain`` is set: then it reads to the end of the
    connection and sets ``left``. Small receive buffers, so a body of a few MiB fills
    them."""

    def __init__(self) -> None:
        self.drain = asyncio.Event()
        self.left = asyncio.Event()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n")
        )
        try:
            async with asyncio.timeout(WAIT_S):
                await self.drain.wait()
                with contextlib.suppress(OSError):
                    while await reader.read(65536):
                        pass
                self.left.set()
        except TimeoutError:
            pass  # never drained: the test fails on ``left``
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        listener.bind(("127.0.0.1", 0))
        server = await asyncio.start_server(self.accept, sock=listener)
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            server.close()


async def test_an_upstream_taking_none_of_the_body_mid_answer_cuts_the_response_short() -> None:
    """Once the answer has started, the response timeout no longer waits for headers but
    still bounds each stretch in which the upstream takes none of the body: past it, the
    client's response ends without its final chunk and the upstream's connection is
    closed, instead of both sides waiting on each other for ever."""
    upstream = TakingNoBody()
    async with (
        upstream.serving() as url,
        serve_in_task(proxy_to(url, response_timeout_s=0.2)) as proxy,
    ):
        reader, writer = await asyncio.open_connection(*host_port(proxy.url))

        async def upload() -> None:
            writer.write(UPLOAD_HEAD)
            with contextlib.suppress(OSError):
                for _ in range(64 * 16):  # up to 64 MiB: far more than the buffers hold
                    writer.write(chunk(b"u" * (64 * 1024)))
                    await writer.drain()

        uploading = asyncio.ensure_future(upload())
        try:
            answer = await within(read_to_close(reader), "the proxy ending the response")
            upstream.drain.set()
            await within(upstream.left.wait(), "the upstream seeing the proxy leave")
        finally:
            uploading.cancel()
            writer.close()

    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b"data: 1\n\n" in answer
    assert not answer.endswith(b"0\r\n\r\n")  # cut short: no final chunk


@pytest.mark.parametrize("response_timeout_s", [300.0, None], ids=["timeout", "no-timeout"])
async def test_a_client_leaving_mid_upload_gives_back_its_seat_and_the_upstreams_count(
    response_timeout_s: float | None,
) -> None:
    """``obleth serve`` streams a body over 8 MiB (not JSON: not read whole to route it)
    to an upstream that answers while it reads. The client sends more after the answer
    started, then leaves: its seat is released, the router's in-flight count for the
    upstream drops back to 0, and the upstream sees the disconnect (they stayed taken
    while the proxy waited, for a body it had stopped sending, or for a disconnect only
    the body's reader had seen)."""
    duplex = Duplex()
    held = 8 * MiB + 1  # more than the proxy holds for a retry: the body is streamed
    settings = {"upstream_response_timeout_s": response_timeout_s}
    async with serving(upstream=duplex, **settings) as served:
        gateway = served.app.gateway
        router = gateway.router
        assert router is not None
        reader, writer = await asyncio.open_connection(*host_port(served.url))
        try:
            writer.write(UPLOAD_HEAD + chunk(b"x" * held))
            await within(writer.drain(), "the first 8 MiB sent")
            received = bytearray()
            await read_until(reader, received, b"data: got %d\n\n" % held)
            writer.write(chunk(b"y" * 1000))
            await read_until(reader, received, b"data: got %d\n\n" % (held + 1000))
            assert gateway.snapshot().inflight == 1
        finally:
            writer.close()

        scheduler = served.scheduler
        await eventually(lambda: scheduler.admitted == scheduler.released, "the seat released")
        await eventually(lambda: not any(router.in_flight().values()), "the count dropped")
        await within(duplex.left.wait(), "the upstream seeing the client leave")
    assert scheduler.admitted == 1
