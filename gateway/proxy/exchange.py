"""One proxied exchange: the request streamed to the upstream, the answer streamed back.

What callers of ``forward`` may rely on:

- The request body is relayed as the client sends it, never buffered whole; the response
  body is relayed chunk by chunk as the upstream sends it, so server-sent events reach the
  client one by one.
- ``forward`` returns when the response is complete, when the client has gone away, or
  when the upstream failed. When the client goes away, the upstream connection is closed
  at once, so the upstream sees the disconnect and stops generating.
- Before the response has started, an upstream failure is answered with an OpenAI-style
  JSON error: 502 ``upstream_unreachable`` (no connection could be made), 502
  ``upstream_failed`` (connected, but no answer came), 503
  ``upstream_connections_exhausted`` (every pooled connection stayed busy for longer than
  the connect timeout).
- After it has started, the status cannot change any more: an upstream failure cuts the
  response short without its end (no final chunk, or fewer bytes than Content-Length), so
  the client sees the truncation instead of taking half an answer for a whole one.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from gateway.asgi.responses import send_json_error
from gateway.errors import Disconnected
from gateway.proxy.headers import to_client, to_upstream
from gateway.types import Message, Receive, Scope, Send

log = logging.getLogger("obleth.proxy")


async def forward(
    client: httpx.AsyncClient, url: httpx.URL, scope: Scope, receive: Receive, send: Send
) -> None:
    """Send the HTTP request of ``scope`` to ``url`` with ``client``; relay the answer."""
    inbound = _Inbound(receive)
    try:
        content = await inbound.content()
    except Disconnected:
        return
    request = httpx.Request(
        scope["method"],
        url,
        headers=to_upstream(scope["headers"]),
        content=content,
        # a Request built by hand gets no timeouts unless it carries the client's
        extensions={"timeout": client.timeout.as_dict()},
    )
    relay = asyncio.ensure_future(_relay(client, request, _ClientSend(send)))
    watch = asyncio.ensure_future(inbound.disconnected())
    try:
        await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # After a disconnect this cancels the relay wherever it is, and the HTTP client
        # closes the upstream connection it was using; after a normal end it does nothing.
        relay.cancel()
        watch.cancel()
        await asyncio.wait((relay, watch))
    if not watch.cancelled():
        watch.exception()  # a receive() that failed means the client is gone: nothing to do
    if not relay.cancelled():
        error = relay.exception()
        if error is not None and not isinstance(error, Disconnected):
            raise error


class _Inbound:
    """The client's side of an exchange: its body for httpx, then its disconnect.

    ``receive`` is read by one party at a time: by httpx while it sends the body, then by
    ``disconnected()``, which waits for the body to be fully relayed before it reads.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._first = b""
        self._body_relayed = asyncio.Event()

    async def content(self) -> bytes | _Inbound | None:
        """The request body as httpx should send it: None when there is none, bytes when
        it came in one message, else this object, an async iterator of its chunks.

        Raises ``Disconnected`` if the client leaves before its first body message.
        """
        message = await self._next()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            self._body_relayed.set()
            return body or None
        self._first = body
        return self

    def __aiter__(self) -> _Inbound:
        return self

    async def __anext__(self) -> bytes:
        first, self._first = self._first, b""
        if first:
            return first
        while not self._body_relayed.is_set():
            message = await self._next()
            if not message.get("more_body", False):
                self._body_relayed.set()
            chunk: bytes = message.get("body", b"")
            if chunk:
                return chunk
        raise StopAsyncIteration

    async def disconnected(self) -> None:
        """Returns once the client has gone away (or, on uvicorn, once the response is
        complete, which then makes no difference)."""
        await self._body_relayed.wait()
        while (await self._receive())["type"] != "http.disconnect":
            pass

    async def _next(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise Disconnected()
        return message


class _ClientSend:
    """The server's ``send``, raising ``Disconnected`` where the server raises ``OSError``.

    The ASGI spec lets a server raise an ``OSError`` subclass when ``send`` is called after
    the client left (uvicorn drops the message instead); either way the exchange just ends.
    """

    __slots__ = ("_send",)

    def __init__(self, send: Send) -> None:
        self._send = send

    async def __call__(self, message: Message) -> None:
        try:
            await self._send(message)
        except OSError as exc:
            raise Disconnected() from exc


async def _relay(client: httpx.AsyncClient, request: httpx.Request, send: Send) -> None:
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        await _answer_failure(send, request.url, exc)
        return
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": to_client(response.headers.raw),
            }
        )
        # raw: the bytes as the upstream encoded them, matching its Content-Length and
        # Content-Encoding, which are forwarded unchanged
        async for chunk in response.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.TransportError as exc:
        log.warning(
            "upstream %s failed mid-response, the client's response was cut short: %s",
            _origin(request.url),
            _describe(exc),
        )
        return  # without the final message: the server closes the connection
    finally:
        await response.aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer_failure(send: Send, url: httpx.URL, exc: httpx.TransportError) -> None:
    if isinstance(exc, httpx.PoolTimeout):
        status, code = 503, "upstream_connections_exhausted"
        message = "every connection to the upstream inference server is busy; retry later"
    elif isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        status, code = 502, "upstream_unreachable"
        message = "the upstream inference server could not be reached; retry later"
    else:
        status, code = 502, "upstream_failed"
        message = "the upstream inference server failed before answering; retry later"
    # the client learns what kind of failure it was; where and why is for the operator
    log.warning("upstream %s: %s; answered %d %s", _origin(url), _describe(exc), status, code)
    await send_json_error(send, status, message, code=code)


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
