"""Stand-ins for the proxy's neighbours: upstreams that fail on cue or echo what they got,
and a router's route.

The upstreams are ASGI apps for ``serve_in_task(app, lifespan="off")``: real HTTP servers
on loopback whose failures are scripted. ``FakeRoute`` stands in for the router's
decision object (``gateway.proxy.Reroutable``); ``routed`` puts it where a router would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp
from gateway.types import ASGIApp, Receive, Scope, Send

T = TypeVar("T")

WAIT_S = 5.0
"""Bound on every wait in these tests: a wait that runs out fails the test, never hangs."""

SSE = [(b"content-type", b"text/event-stream")]


async def within(awaitable: Awaitable[T], what: str) -> T:
    """``await awaitable``, failing the test if it takes longer than ``WAIT_S``."""
    try:
        async with asyncio.timeout(WAIT_S):
            return await awaitable
    except TimeoutError:
        pytest.fail(f"{what}: still waiting after {WAIT_S} s")


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds, failing the test after ``WAIT_S``."""
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"{what}: not true after {WAIT_S} s")


async def read_cut_short(response: httpx.Response) -> bytes:
    """What a streamed response delivered before it ended truncated; fails the test if
    it ends cleanly."""
    received: list[bytes] = []

    async def read_to_the_end() -> None:
        async for chunk in response.aiter_raw():
            received.append(chunk)

    with pytest.raises(httpx.RemoteProtocolError, match="incomplete"):
        await within(read_to_the_end(), "the end of the response")
    return b"".join(received)


def unused_port() -> int:
    """A port nothing listens on: bound by the kernel, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def closed_upstream() -> str:
    """The base URL of an upstream that refuses connections."""
    return f"http://127.0.0.1:{unused_port()}"


Accept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_upstream(accept: Accept) -> AsyncIterator[str]:
    """A raw TCP upstream on 127.0.0.1 that hands each connection to ``accept``, for
    answers no HTTP server library would give; yields its base URL."""
    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


class FakeRoute:
    """A router's decision for one request: a fixed ranking, best first.

    ``reroute()`` moves to the next upstream in the ranking, or returns None past its end;
    ``reroutes`` counts the calls.
    """

    def __init__(self, *ranking: str) -> None:
        self.ranking = ranking
        self.upstream = ranking[0]
        self.reroutes = 0

    def reroute(self) -> str | None:
        self.reroutes += 1
        if self.reroutes >= len(self.ranking):
            return None
        self.upstream = self.ranking[self.reroutes]
        return self.upstream


def routed(app: ASGIApp, route: FakeRoute, *, with_upstream_key: bool = True) -> ASGIApp:
    """``app`` behind a stand-in router that sends every HTTP request by ``route``.

    Like the gateway's router it sets ``scope["state"]["obleth"]``: ``["route"]``, and
    ``["upstream"]`` unless ``with_upstream_key`` is False.
    """

    async def router(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            obleth: dict[str, object] = {"route": route}
            if with_upstream_key:
                obleth["upstream"] = route.upstream
            scope["state"] = {"obleth": obleth}
        await app(scope, receive, send)

    return router


@contextlib.asynccontextmanager
async def proxy_over(
    first: ASGIApp, second: ASGIApp, proxy: ProxyApp | None = None
) -> AsyncIterator[tuple[str, FakeRoute]]:
    """``proxy`` (a default ``ProxyApp``) served on loopback in front of two served
    upstreams, routed to ``first`` and rerouted to ``second``; yields the proxy's URL and
    the route, whose ``reroutes`` say whether the second was asked."""
    async with (
        serve_in_task(first, lifespan="off") as one,
        serve_in_task(second, lifespan="off") as other,
    ):
        route = FakeRoute(one.url, other.url)
        async with serve_in_task(routed(proxy or ProxyApp(), route)) as served:
            yield served.url, route


@dataclass(frozen=True)
class Received:
    """One request as an upstream received it."""

    method: str
    raw_path: bytes
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def read_body(receive: Receive) -> bytes:
    """A request's whole body, as an upstream reads it."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


class Answering:
    """An upstream that reads each request whole and answers ``status`` with the JSON body
    ``{"upstream": name, "status": status}``; ``received`` keeps the requests."""

    def __init__(self, name: str, status: int) -> None:
        self.name = name
        self.status = status
        self.received: list[Received] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.received.append(
            Received(
                scope["method"], scope["raw_path"], scope["query_string"], scope["headers"], body
            )
        )
        answer = json.dumps({"upstream": self.name, "status": self.status})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer.encode()})


class Stalling:
    """An upstream that stops mid-exchange and waits, up to ``WAIT_S``, for the proxy to
    leave: before its response headers, or after the headers and ``first_chunk``.

    ``left`` is set when it sees the disconnect.
    """

    def __init__(self, *, first_chunk: bytes | None = None) -> None:
        self.first_chunk = first_chunk
        self.requests = 0
        self.left = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        if self.first_chunk is not None:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
            body = {"type": "http.response.body", "body": self.first_chunk, "more_body": True}
            await send(body)
        try:
            async with asyncio.timeout(WAIT_S):
                while (await receive())["type"] != "http.disconnect":
                    pass
        except TimeoutError:
            return  # nobody left: the test fails on ``left``, and uvicorn closes the stream
        self.left.set()


class Gated:
    """A streaming upstream that sends ``data: 1``, then waits (up to ``WAIT_S``) for
    ``release`` before it sends ``data: 2``, ``data: 3`` and ``data: [DONE]``.

    ``sent_last`` says whether the last event has been produced yet.
    """

    EVENTS = b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: [DONE]\n\n"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent_last = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        try:
            async with asyncio.timeout(WAIT_S):
                await self.release.wait()
        except TimeoutError:
            return  # never released: the response is cut short and the test fails
        for event in (b"data: 2\n\n", b"data: 3\n\n"):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        self.sent_last = True
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def breaks_after_first_chunk(scope: Scope, receive: Receive, send: Send) -> None:
    """An upstream that starts a 200 event stream, sends one event and drops the connection."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    # returning unfinished makes uvicorn close the connection mid-body


class Echo:
    """An upstream that answers every request 200 with what it received, as JSON:
    ``method``, ``raw_path``, ``headers`` (``[name, value]`` pairs, as sent) and
    ``body_bytes``; ``/metrics`` gets an empty Prometheus page, so a gateway polling it
    sees a healthy upstream. A request for ``/hold`` waits (up to ``WAIT_S``) for
    ``release`` before it answers, holding its seat at the gateway meanwhile.

    ``received`` keeps the ``x-test-id`` header of every request answered.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.received: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if scope["path"] == "/metrics":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/hold":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAIT_S):
                    await self.release.wait()
        headers = [
            [name.decode("latin-1"), value.decode("latin-1")] for name, value in scope["headers"]
        ]
        tags = [value for name, value in headers if name == "x-test-id"]
        self.received.extend(tags)
        answer = {
            "method": scope["method"],
            "raw_path": scope["raw_path"].decode("latin-1"),
            "headers": headers,
            "body_bytes": size,
        }
        body = json.dumps(answer).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})


def header_values(answer: dict[str, Any], name: str) -> list[str]:
    """The values of header ``name`` (lower case) in an ``Echo`` answer, in order."""
    return [value for header, value in answer["headers"] if header == name]


class Duplex:
    """An upstream that answers a POST at once, before it has read the body, and then
    sends one event per body message it reads (``data: got N``, N the bytes read so far),
    and ``data: [DONE]`` after the last: like a transcription streamed while the audio is
    still uploading. Any other request gets an empty 200 (so ``/health`` and ``/metrics``
    make it healthy).

    ``received`` counts the body bytes read so far; ``left`` is set when it sees the
    disconnect before the body ended.
    """

    def __init__(self) -> None:
        self.received = 0
        self.left = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.left.set()
                return
            self.received += len(message.get("body", b""))
            event = b"data: got %d\n\n" % self.received
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
