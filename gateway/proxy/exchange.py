"""One proxied exchange: the request sent upstream (once more, to the next-best upstream,
when the first one failed before answering) and the answer streamed back.

What callers of ``forward`` may rely on:

- The response body is relayed chunk by chunk as the upstream sends it, so server-sent
  events reach the client one by one.
- Without a route, the request body is relayed as the client sends it, never buffered
  whole. With a route, a body of up to ``retry_body_bytes`` is read whole before the
  request goes upstream, so that it can be sent a second time; a larger one is relayed as
  it comes, and that request is never retried.
- One retry, only with a route and a body held whole: when the upstream fails before
  anything was sent to the client, the route gives it up (``route.reroute()``) and the
  same request (method, path, query, headers, body) goes to the upstream the route names
  next. Any method is retried, POST included: nothing was answered yet. Failures that
  count: no connection could be made (refused, connect timeout), the connection broke
  before the response headers, a 5xx status. Failures that do not: the response timeout
  (the upstream may still be working on the request, and a second copy elsewhere would
  add load where it hurts most) and a saturated connection pool (the pool is shared by all
  upstreams, so a retry would wait on the same pool). There is never a second retry.
  When the route has no other upstream, the failure is answered as without a route: a 5xx
  is relayed as the upstream sent it, a connection failure gets the JSON error below.
- ``forward`` returns when the response is complete, when the client has gone away, or
  when the upstream failed. When the client goes away, at whatever stage (a retry
  included), the upstream sees the disconnect and stops generating: once the response
  has started, ``forward`` ends its side of the connection and returns when the upstream
  has closed its own (at most ``HANG_UP_S`` later), so that the request's seat is not
  handed on while the upstream still runs the request; before that, the connection is
  closed at once.
- Before the response has started, an upstream failure is answered with an OpenAI-style
  JSON error: 502 ``upstream_unreachable`` (no connection could be made), 502
  ``upstream_failed`` (connected, but no answer came), 503
  ``upstream_connections_exhausted`` (every pooled connection stayed busy for longer than
  the connect timeout), 504 ``upstream_timeout`` (no response headers within
  ``response_timeout_s``; the clock starts once the request is written, so connecting
  and a slow upload do not count; or the upstream took none of the body for that long).
- After it has started, the status cannot change any more: an upstream failure, or a
  silence of more than ``read_timeout_s`` between two body chunks, cuts the response short
  without its end (no final chunk, or fewer bytes than Content-Length), so the client
  sees the truncation instead of taking half an answer for a whole one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.asgi.responses import send_json_error
from gateway.errors import ConfigError, Disconnected
from gateway.proxy.forwarding import TrustedProxies, upstream_headers
from gateway.proxy.headers import to_client
from gateway.proxy.inbound import ClientSend, Inbound
from gateway.proxy.upstream import Reroutable, target_url
from gateway.routing.upstreams import parse_upstream
from gateway.types import Receive, Scope, Send

log = logging.getLogger("obleth.proxy")

RETRY_BODY_BYTES = 8 * 1024 * 1024
"""Default bound on the request body held in memory so that a retry can send it again."""

HANG_UP_S = 1.0
"""How long, after the client left mid-response, the upstream has to close its side of the
connection before the proxy closes it regardless (see ``_hang_up``)."""

_NOBODY = TrustedProxies()

Answered = Callable[[str, str], None]
"""``answered(upstream, status)``: what an attempt got, ``status`` an HTTP status or
``"error"``."""

# Failures before the response headers after which another upstream has a better chance.
_WORTH_RETRYING = (httpx.ConnectTimeout, httpx.NetworkError, httpx.RemoteProtocolError)


async def forward(
    client: httpx.AsyncClient,
    url: httpx.URL,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    route: Reroutable | None = None,
    retry_body_bytes: int = RETRY_BODY_BYTES,
    response_timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    trusted_proxies: TrustedProxies | None = None,
    upstream: str | None = None,
    answered: Answered | None = None,
) -> None:
    """Send the HTTP request of ``scope`` to ``url`` with ``client``; relay the answer.

    ``route``, the router's handle on this request, allows the one retry described in the
    module docstring for a body of at most ``retry_body_bytes``. The timeouts are seconds,
    None for no limit. ``trusted_proxies`` are the peers whose forwarding headers are
    believed (see ``gateway.proxy.forwarding``); None trusts nobody. ``answered`` is told
    the status each attempt got (see ``ProxyApp``), ``upstream`` being the first attempt's
    upstream as chosen (a retry's is the route's).
    """
    inbound = Inbound(receive)
    try:
        content = await inbound.content(hold_up_to=retry_body_bytes if route is not None else 0)
    except Disconnected:
        return
    # only a body held whole, within the bound, can be sent a second time
    if isinstance(content, Inbound) or len(content or b"") > retry_body_bytes:
        route = None
    trusted = trusted_proxies if trusted_proxies is not None else _NOBODY
    request = _Upstream(client, scope, content, response_timeout_s, trusted)
    client_send = ClientSend(send)
    tell = None if answered is None or upstream is None else _Telling(answered, upstream, route)
    relay = asyncio.ensure_future(_relay(request, url, route, client_send, read_timeout_s, tell))
    watch = asyncio.ensure_future(inbound.disconnected())
    try:
        await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
        if not relay.done():
            # the client left mid-response: the seat this request holds is given back once
            # the upstream has dropped the request too, not while it still runs it
            client_send.gone = True
            await request.hang_up(relay)
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


class _Upstream:
    """The client's request as upstreams get it: the same method, path, query, headers
    (with this hop's forwarding headers) and body, to whichever upstream it is sent."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        scope: Scope,
        content: bytes | Inbound | None,
        response_timeout_s: float | None,
        trusted: TrustedProxies,
    ) -> None:
        self._client = client
        self._scope = scope
        self._method: str = scope["method"]
        self._headers = upstream_headers(scope, trusted)
        self._content = content
        self._response_timeout_s = response_timeout_s
        #: the response being relayed, while it is
        self.response: httpx.Response | None = None

    async def hang_up(self, relay: asyncio.Future[None]) -> None:
        """Tell the upstream the client is gone, by ending our side of the connection of
        the response being relayed, and wait at most ``HANG_UP_S`` for ``relay`` to end:
        it does once the upstream has dropped the request and closed its side (what the
        upstream sends meanwhile is relayed to nobody). Without a response yet there is
        no connection of this request's own to end: the caller closes it."""
        response = self.response
        stream = None if response is None else response.extensions.get("network_stream")
        sock = None if stream is None else stream.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return
        try:
            # on a duplicate of the descriptor: uvloop's transports hand out sockets that
            # may not be shut down themselves, and a shutdown acts on the connection
            with socket.socket(fileno=os.dup(sock.fileno())) as ours:
                ours.shutdown(socket.SHUT_WR)
        except OSError:
            return
        await asyncio.wait((relay,), timeout=HANG_UP_S)

    def url_on(self, base: httpx.URL) -> httpx.URL:
        """Where the request goes on the upstream at ``base``."""
        return target_url(base, self._scope)

    async def send_to(self, url: httpx.URL) -> httpx.Response | httpx.TransportError:
        """The response from ``url``, its body still to be read, or the failure that came
        instead; no response headers within the response timeout is ``httpx.ReadTimeout``
        (the client itself has no read timeout)."""
        timeouts = self._client.timeout.as_dict()
        if self._response_timeout_s is not None:
            # an upstream that stops taking the body for that long is not going to answer
            # either: without this a write into its full socket would wait for ever
            timeouts["write"] = self._response_timeout_s
        request = httpx.Request(
            self._method,
            url,
            headers=self._headers,
            content=self._content,
            # a Request built by hand gets no timeouts unless it carries the client's
            extensions={"timeout": timeouts},
        )
        deadline = asyncio.timeout(None)
        if self._response_timeout_s is not None:
            request.extensions["trace"] = _start_when_written(deadline, self._response_timeout_s)
        try:
            async with deadline:
                self.response = await self._client.send(request, stream=True)
                return self.response
        except httpx.TransportError as exc:
            return exc
        except TimeoutError:
            if not deadline.expired():
                raise
            return httpx.ReadTimeout(
                f"no response headers within {self._response_timeout_s} s of sending the request",
                request=request,
            )


def _start_when_written(
    deadline: asyncio.Timeout, seconds: float
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` callback (httpx's documented ``trace`` request extension)
    that sets ``deadline`` ``seconds`` ahead once the request is written and the wait for
    the response headers begins."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith(".receive_response_headers.started"):
            deadline.reschedule(asyncio.get_running_loop().time() + seconds)

    return trace


async def _relay(
    upstream: _Upstream,
    url: httpx.URL,
    route: Reroutable | None,
    send: ClientSend,
    read_timeout_s: float | None,
    tell: _Telling | None,
) -> None:
    outcome = await upstream.send_to(url)
    if tell is not None:
        tell.first(outcome)
    try:
        if route is not None and _worth_retrying(outcome):
            # a 5xx is kept open until the route has answered: with nowhere else to go,
            # the client gets the upstream's own answer
            retry_url = _next_upstream(route, upstream, url, outcome)
            if retry_url is not None:
                await _discard(outcome)
                url = retry_url
                outcome = await upstream.send_to(url)
                if tell is not None:
                    tell.again(outcome)
        if isinstance(outcome, httpx.Response):
            await _stream_back(outcome, send, read_timeout_s)
        else:
            await _answer_failure(send, url, outcome)
    finally:
        await _discard(outcome)


class _Telling:
    """Tells ``answered`` what each attempt of one request got."""

    __slots__ = ("_answered", "_route", "_upstream")

    def __init__(self, answered: Answered, upstream: str, route: Reroutable | None) -> None:
        self._answered = answered
        self._upstream = upstream
        self._route = route

    def first(self, outcome: httpx.Response | httpx.TransportError) -> None:
        self._answered(self._upstream, _status_of(outcome))

    def again(self, outcome: httpx.Response | httpx.TransportError) -> None:
        """A retry's, on the upstream the route moved to."""
        assert self._route is not None
        self._answered(self._route.upstream, _status_of(outcome))


def _status_of(outcome: httpx.Response | httpx.TransportError) -> str:
    return str(outcome.status_code) if isinstance(outcome, httpx.Response) else "error"


def _worth_retrying(outcome: httpx.Response | httpx.TransportError) -> bool:
    if isinstance(outcome, httpx.Response):
        return outcome.status_code >= 500
    return isinstance(outcome, _WORTH_RETRYING)


def _next_upstream(
    route: Reroutable,
    upstream: _Upstream,
    failed: httpx.URL,
    outcome: httpx.Response | httpx.TransportError,
) -> httpx.URL | None:
    """Where to send the request again, after asking ``route`` to give up ``failed``;
    None when there is nowhere else."""
    chosen = route.reroute()
    if chosen is None:
        return None
    what = (
        f"answered {outcome.status_code}"
        if isinstance(outcome, httpx.Response)
        else f"failed before answering ({_describe(outcome)})"
    )
    try:
        base = parse_upstream(chosen, "the upstream returned by route.reroute()")
    except ConfigError as exc:
        log.error("upstream %s %s; cannot retry elsewhere: %s", _origin(failed), what, exc)
        return None
    url = upstream.url_on(base)
    log.warning("upstream %s %s; retrying on %s", _origin(failed), what, _origin(url))
    return url


async def _discard(outcome: httpx.Response | httpx.TransportError) -> None:
    if isinstance(outcome, httpx.Response):
        await outcome.aclose()


async def _stream_back(
    response: httpx.Response, send: ClientSend, read_timeout_s: float | None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": to_client(response.headers.raw),
        }
    )
    # raw: the bytes as the upstream encoded them, matching its Content-Length and
    # Content-Encoding, which are forwarded unchanged
    chunks = response.aiter_raw()
    while True:
        try:
            async with asyncio.timeout(read_timeout_s):
                chunk = await anext(chunks, None)
        except httpx.TransportError as exc:
            if not send.gone:  # else the upstream closed because we told it to
                _log_cut_short(response, _describe(exc))
            return  # without the final message: the server closes the connection
        except TimeoutError:
            _log_cut_short(response, f"sent nothing for {read_timeout_s} s")
            return
        if chunk is None:
            break
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _log_cut_short(response: httpx.Response, why: str) -> None:
    log.warning(
        "upstream %s %s mid-response; the client's response was cut short",
        _origin(response.request.url),
        why,
    )


async def _answer_failure(send: Send, url: httpx.URL, exc: httpx.TransportError) -> None:
    if isinstance(exc, httpx.PoolTimeout):
        status, code = 503, "upstream_connections_exhausted"
        message = "every connection to the upstream inference server is busy; retry later"
    elif isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        status, code = 502, "upstream_unreachable"
        message = "the upstream inference server could not be reached; retry later"
    elif isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        status, code = 504, "upstream_timeout"
        message = "the upstream inference server did not start answering in time; retry later"
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
