"""Scraper: the poller's HTTP/1.1 client, GETs to one upstream on kept-alive connections.

The poller sends two small GETs to every upstream each polling interval, for ever. Through
httpx one costs about 700 µs of CPU (its client, httpcore's pool, anyio's streams), which
made an idle gateway spend 10 to 12 ms of CPU per second per upstream; through aiohttp,
130 µs. Written on an asyncio transport and parsed by httptools (llhttp, which uvicorn
parses requests with), one costs about 50 µs. It does only what the poller needs: GET,
no redirects, no proxies, no cookies, no compression.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from typing import cast

import httptools
import httpx

from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from gateway.routing.upstreams import parse_upstream

#: Idle connections kept per upstream; a round uses two at once, and rounds never overlap.
IDLE_KEPT = 2


class Unanswered(Exception):
    """A GET that got no 2xx answer; the message says what happened instead."""


class _Dropped(Exception):
    """The connection closed before any byte of the answer: the request may never have
    been read (an idle connection the upstream closed as we wrote on it)."""


class Scraper:
    """GET requests to the origin of one upstream, each bounded in time and in body size.

    What callers may rely on:

    - ``get(url)`` returns the body of a ``2xx`` answer to ``GET url``, read in full, or
      raises ``Unanswered`` saying why not: no connection, no whole answer within
      ``timeout_s`` (connecting included), another status, a body over
      ``max_body_bytes``, an answer that is not HTTP/1.x. Redirects are answers like any
      other non-2xx status. ``url`` must be on the origin the scraper was made for.
    - Connections are kept alive between requests, at most ``IDLE_KEPT`` idle ones, each
      for at most ``KEEPALIVE_EXPIRY_S`` of idleness (below uvicorn's keep-alive timeout,
      so that we drop a connection before the upstream does). A connection goes back to
      the pool only after a whole answer that allows it; any failure closes it.
    - A request that fails on a reused connection before any byte of the answer arrived
      is sent once more on a new connection, within the same ``timeout_s``: the upstream
      may have closed the idle connection as we wrote on it, which says nothing about it.
    - ``https`` upstreams are verified as httpx verifies them (its default CA bundle);
      the environment (proxies, ``SSL_CERT_FILE``) is ignored, as the proxy ignores it.
    - ``close()`` closes every connection; a later ``get`` opens new ones.
    """

    def __init__(self, base_url: str, *, timeout_s: float, max_body_bytes: int) -> None:
        origin = parse_upstream(base_url)
        self._scheme = origin.scheme
        self._host = origin.host
        self._port = origin.port or (443 if origin.scheme == "https" else 80)
        self._netloc = origin.netloc
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._requests: dict[str, bytes] = {}
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def get(self, url: str) -> bytes:
        request = self._requests.get(url)
        if request is None:
            request = self._requests[url] = self._request_for(url)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._exchange(url, request)
        except TimeoutError:
            raise Unanswered(f"GET {url}: no answer within {self._timeout_s} s") from None

    def close(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()

    async def _exchange(self, url: str, request: bytes) -> bytes:
        connection = self._reusable()
        if connection is not None:
            try:
                return await self._send(connection, url, request)
            except _Dropped:
                pass
        connection = await self._connect(url)
        try:
            return await self._send(connection, url, request)
        except _Dropped as exc:
            raise Unanswered(f"GET {url}: {exc}") from None

    async def _send(self, connection: _Connection, url: str, request: bytes) -> bytes:
        try:
            status, body, keep_alive = await connection.exchange(url, request)
        except BaseException:
            self._discard(connection)
            raise
        if keep_alive and connection.reusable and len(self._idle) < IDLE_KEPT:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            self._discard(connection)
        if not 200 <= status < 300:
            raise Unanswered(f"GET {url}: answered {status}")
        return body

    def _reusable(self) -> _Connection | None:
        """The most recently used idle connection still open and not expired, or None."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and now - connection.idle_since < KEEPALIVE_EXPIRY_S:
                return connection
            self._discard(connection)
        return None

    async def _connect(self, url: str) -> _Connection:
        loop = asyncio.get_running_loop()
        max_body = self._max_body_bytes
        tls = _tls_context() if self._scheme == "https" else None
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(max_body),
                self._host,
                self._port,
                ssl=tls,
                server_hostname=self._host if tls is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise Unanswered(f"GET {url}: cannot connect: {exc}") from None
        self._open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    def _request_for(self, url: str) -> bytes:
        parsed = httpx.URL(url)
        if (parsed.scheme, parsed.netloc) != (self._scheme, self._netloc):
            raise ValueError(f"{url!r} is not on the origin this scraper was made for")
        return b"".join(
            (
                b"GET ",
                parsed.raw_path,
                b" HTTP/1.1\r\nHost: ",
                self._netloc,
                b"\r\nUser-Agent: obleth-poller\r\nAccept: */*\r\n\r\n",
            )
        )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verification, made once: loading the CA bundle takes milliseconds."""
    return httpx.create_ssl_context(trust_env=False)


class _Connection(asyncio.Protocol):
    """One connection: writes a request, hands back the answer's status, body and whether
    the connection may be used again. httptools calls the ``on_*`` methods."""

    def __init__(self, max_body_bytes: int) -> None:
        self._url = ""
        self._max_body_bytes = max_body_bytes
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._problem: str | None = None
        self._started = False
        self._headers_done = False
        # the body ends where a length or the last chunk says, not at the connection's close
        self._delimited = False
        self._closed = False
        self._spoiled = False
        self.idle_since = 0.0

    @property
    def reusable(self) -> bool:
        return not (self._closed or self._spoiled)

    def exchange(self, url: str, request: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Write ``request`` (a GET of ``url``); the future gets ``(status, body,
        keep_alive)``, or the exception saying why there is no answer."""
        self._url = url
        self._answer = answer = asyncio.get_running_loop().create_future()
        self._body = []
        self._size = 0
        self._problem = None
        self._started = self._headers_done = self._delimited = False
        if self._closed or self._transport is None:
            answer.set_exception(_Dropped("the connection was closed"))
        else:
            self._transport.write(request)
        return answer

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, only alike
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():
            # bytes nobody asked for: this connection no longer speaks in step with us
            self._spoiled = True
            self.close()
            return
        self._started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"not an HTTP/1.x answer ({exc})")
            return
        if self._problem is not None:
            self._fail(self._problem)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._headers_done and not self._delimited and self._problem is None:
            # neither a length nor chunks: the body is what came before the close
            answer.set_result((self._parser.get_status_code(), b"".join(self._body), False))
        elif not self._started:
            answer.set_exception(_Dropped("the connection closed before an answer"))
        else:
            answer.set_exception(Unanswered(f"GET {self._url}: the connection closed mid-answer"))

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._answer is None or self._answer.done():
            self._spoiled = True  # a second answer to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._problem is not None:
            return
        self._size += len(body)
        if self._size > self._max_body_bytes:
            self._problem = f"GET {self._url}: body over {self._max_body_bytes} bytes"
            self._body = []
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None or answer.done() or self._problem is not None:
            return
        parser = self._parser
        body = b"".join(self._body)
        answer.set_result((parser.get_status_code(), body, parser.should_keep_alive()))

    def _fail(self, problem: str) -> None:
        self.close()
        answer = self._answer
        if answer is not None and not answer.done():
            message = problem if problem.startswith("GET ") else f"GET {self._url}: {problem}"
            answer.set_exception(Unanswered(message))
