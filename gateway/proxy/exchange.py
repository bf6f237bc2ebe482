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
import io
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable

import aiohttp
import httpx
from yarl import URL

from gateway.errors import ConfigError, Disconnected
from gateway.proxy.client import Attempt, UpstreamFailure, answer_failure
from gateway.proxy.deadlines import Silence, bounded_writes
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

Outcome = aiohttp.ClientResponse | UpstreamFailure
"""What one attempt got: a response (its body still to be read), or the failure instead."""

#: a body larger than this is handed to the session as a stream of its parts, which it
#: writes without holding up the event loop (aiohttp warns about larger bytes)
_WRITTEN_AT_ONCE = 1024 * 1024

#: failures before the response headers after which another upstream has a better chance
_WORTH_RETRYING = frozenset({"unreachable", "failed"})


async def forward(
    session: aiohttp.ClientSession,
    url: URL,
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
    """Send the HTTP request of ``scope`` to ``url`` with ``session``; relay the answer.

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
    request = _Upstream(session, scope, content, response_timeout_s, trusted)
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
        # After a disconnect this cancels the relay wherever it is, and the response is
        # closed with its connection; after a normal end it does nothing.
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
        session: aiohttp.ClientSession,
        scope: Scope,
        content: bytes | Inbound | None,
        response_timeout_s: float | None,
        trusted: TrustedProxies,
    ) -> None:
        self._session = session
        self._scope = scope
        self._method: str = scope["method"]
        self._headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in upstream_headers(scope, trusted)
        ]
        self._content = content
        self._response_timeout_s = response_timeout_s
        #: the response being relayed, while it is
        self.response: aiohttp.ClientResponse | None = None

    async def hang_up(self, relay: asyncio.Future[None]) -> None:
        """Tell the upstream the client is gone, by ending our side of the connection of
        the response being relayed, and wait at most ``HANG_UP_S`` for ``relay`` to end:
        it does once the upstream has dropped the request and closed its side (what the
        upstream sends meanwhile is relayed to nobody). Without a response yet there is
        no connection of this request's own to end: the caller closes it."""
        response = self.response
        connection = None if response is None else response.connection
        transport = None if connection is None else connection.transport
        sock = None if transport is None else transport.get_extra_info("socket")
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

    def url_on(self, base: httpx.URL) -> URL:
        """Where the request goes on the upstream at ``base``."""
        return target_url(base, self._scope)

    async def send_to(self, url: URL) -> Outcome:
        """The response from ``url``, its body still to be read, or the failure that came
        instead."""
        loop = asyncio.get_running_loop()
        timeout = self._response_timeout_s
        deadline = asyncio.timeout(None)
        content = self._content
        data: bytes | io.BytesIO | AsyncIterator[bytes] | None = content
        if isinstance(content, bytes) and len(content) > _WRITTEN_AT_ONCE:
            data = io.BytesIO(content)  # written in parts, a new reader for each attempt
        start_at_head = None
        if timeout is not None:
            if isinstance(content, Inbound):
                data = bounded_writes(content, deadline, timeout)
            else:
                # the whole request follows its head at once: the wait for the answer (and
                # for the upstream to take the body) starts there
                def start_at_head() -> None:
                    deadline.reschedule(loop.time() + timeout)

        attempt = Attempt(start_at_head)
        try:
            async with deadline:
                self.response = await self._session.request(
                    self._method,
                    url,
                    headers=self._headers,
                    data=data,
                    allow_redirects=False,
                    trace_request_ctx=attempt,
                )
                return self.response
        except aiohttp.ClientConnectorError as exc:
            return UpstreamFailure("unreachable", _describe(exc))
        except aiohttp.ConnectionTimeoutError as exc:
            if attempt.queued:
                return UpstreamFailure("exhausted", "no pooled connection came free in time")
            return UpstreamFailure("unreachable", f"connecting timed out ({_describe(exc)})")
        except aiohttp.ClientError as exc:
            return UpstreamFailure("failed", _describe(exc))
        except TimeoutError:
            if not deadline.expired():
                raise
            return UpstreamFailure(
                "timeout", f"no response headers within {timeout} s of sending the request"
            )


async def _relay(
    upstream: _Upstream,
    url: URL,
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
                _discard(outcome)
                url = retry_url
                outcome = await upstream.send_to(url)
                if tell is not None:
                    tell.again(outcome)
        if isinstance(outcome, UpstreamFailure):
            await answer_failure(send, _origin(url), outcome)
        else:
            await _stream_back(outcome, url, send, read_timeout_s)
    finally:
        _discard(outcome)


class _Telling:
    """Tells ``answered`` what each attempt of one request got."""

    __slots__ = ("_answered", "_route", "_upstream")

    def __init__(self, answered: Answered, upstream: str, route: Reroutable | None) -> None:
        self._answered = answered
        self._upstream = upstream
        self._route = route

    def first(self, outcome: Outcome) -> None:
        self._answered(self._upstream, _status_of(outcome))

    def again(self, outcome: Outcome) -> None:
        """A retry's, on the upstream the route moved to."""
        assert self._route is not None
        self._answered(self._route.upstream, _status_of(outcome))


def _status_of(outcome: Outcome) -> str:
    return "error" if isinstance(outcome, UpstreamFailure) else str(outcome.status)


def _worth_retrying(outcome: Outcome) -> bool:
    if isinstance(outcome, UpstreamFailure):
        return outcome.kind in _WORTH_RETRYING
    return outcome.status >= 500


def _next_upstream(
    route: Reroutable, upstream: _Upstream, failed: URL, outcome: Outcome
) -> URL | None:
    """Where to send the request again, after asking ``route`` to give up ``failed``;
    None when there is nowhere else."""
    chosen = route.reroute()
    if chosen is None:
        return None
    what = (
        f"failed before answering ({outcome})"
        if isinstance(outcome, UpstreamFailure)
        else f"answered {outcome.status}"
    )
    try:
        base = parse_upstream(chosen, "the upstream returned by route.reroute()")
    except ConfigError as exc:
        log.error("upstream %s %s; cannot retry elsewhere: %s", _origin(failed), what, exc)
        return None
    url = upstream.url_on(base)
    log.warning("upstream %s %s; retrying on %s", _origin(failed), what, _origin(url))
    return url


def _discard(outcome: Outcome) -> None:
    """Close a response: its connection goes back to the pool when its body was read to
    the end, and is closed otherwise (the upstream sees the request dropped)."""
    if not isinstance(outcome, UpstreamFailure):
        outcome.close()


async def _stream_back(
    response: aiohttp.ClientResponse, url: URL, send: ClientSend, read_timeout_s: float | None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": to_client(response.raw_headers),
        }
    )
    # the bytes as the upstream encoded them (the session never decodes), matching its
    # Content-Length and Content-Encoding, which are forwarded unchanged
    read = response.content.readany
    silence = None if read_timeout_s is None else Silence(read_timeout_s)
    try:
        while True:
            if silence is not None:
                silence.reading = True
                chunk = await read()
                silence.reading = False
            else:
                chunk = await read()
            if not chunk:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except aiohttp.ClientError as exc:
        if not send.gone:  # else the upstream closed because we told it to
            _log_cut_short(url, _describe(exc))
        return  # without the final message: the server closes the connection
    except asyncio.CancelledError:
        if silence is None or not silence.expired():
            raise
        _log_cut_short(url, f"sent nothing for {read_timeout_s} s")
        return
    finally:
        if silence is not None:
            silence.stop()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _log_cut_short(url: URL, why: str) -> None:
    log.warning(
        "upstream %s %s mid-response; the client's response was cut short", _origin(url), why
    )


def _origin(url: URL) -> str:
    return f"{url.scheme}://{url.raw_authority}"


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
