"""One proxied exchange: the request sent upstream (once more, to the next-best upstream,
when the first one failed before answering and cannot have run it) and the answer
streamed back.

What callers of ``forward`` may rely on:

- The response body is relayed chunk by chunk as the upstream sends it, so server-sent
  events reach the client one by one.
- Without a route, the request body is relayed as the client sends it, never buffered
  whole. With a route, a body of up to ``retry_body_bytes`` is read whole before the
  request goes upstream, so that it can be sent a second time; a larger one is relayed as
  it comes, and that request is never retried.
- One retry, only with a route and a body held whole: when the upstream failed before
  anything was sent to the client, and provably did not run the request (or the method
  is idempotent), the route gives it up (``route.reroute()``) and the same request
  (method, path, query, headers, body) goes to the upstream the route names next.
  ``gateway.proxy.retries`` says which failures and statuses qualify: for a POST, no
  connection (refused, connect timeout), a connection broken before the request was
  handed to it, and a 503; never a 500, 502 or 504, a response timeout, or an answer the
  proxy cannot read. There is never a second retry. When the route has no other
  upstream, the failure is answered as without a route: a 5xx is relayed as the upstream
  sent it, a connection failure gets the JSON error below.
- ``forward`` returns when the response is complete, when the client has gone away, or
  when the upstream failed. When the client goes away, at whatever stage (a retry
  included), the upstream sees the disconnect and stops generating: once the request
  has a connection, ``forward`` ends its side of it and returns when the upstream has
  closed its own (at most ``HANG_UP_S`` later, see ``gateway.proxy.outbound``), so that
  the request's seat is not handed on while the upstream still runs the request, the
  response started or not; what the attempt then gets is neither retried nor counted
  as the upstream's failure. Before it has a connection, nothing reached the upstream.
  A client that leaves while its body is still being streamed upstream is seen by the
  body's reader, at once too.
- A request header value that is not UTF-8 is read as ISO-8859-1 and sent as the same
  characters in UTF-8 (see ``gateway.proxy.headers.as_text``).
- Before the response has started, an upstream failure is answered with an OpenAI-style
  JSON error: 502 ``upstream_unreachable`` (no connection could be made), 502
  ``upstream_failed`` (connected, but no answer came), 502 ``upstream_bad_response`` (an
  answer whose head cannot be read: no HTTP, over the session's bounds, a 1xx as the
  final response or a status past 599), 503
  ``upstream_connections_exhausted`` (every pooled connection stayed busy for longer than
  the connect timeout), 504 ``upstream_timeout`` (no response headers within
  ``response_timeout_s``; the clock starts once the request is written, so connecting
  and a slow upload do not count; or the upstream took none of the body for that long).
- After it has started, the status cannot change any more: an upstream failure, a
  silence of more than ``read_timeout_s`` between two body chunks, or an upstream that
  takes none of a body still being streamed to it for ``response_timeout_s`` (it may
  answer while it reads), cuts the response short without its end (no final chunk, or
  fewer bytes than Content-Length), so the client sees the truncation instead of taking
  half an answer for a whole one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from yarl import URL

from gateway.errors import ConfigError, Disconnected
from gateway.proxy.client import UpstreamFailure, answer_failure
from gateway.proxy.deadlines import Watchdog
from gateway.proxy.forwarding import TrustedProxies, upstream_headers
from gateway.proxy.headers import as_text, to_client
from gateway.proxy.inbound import ClientSend, Inbound
from gateway.proxy.outbound import Outbound, Outcome, describe
from gateway.proxy.retries import worth_retrying
from gateway.proxy.upstream import Reroutable, client_location
from gateway.routing.upstreams import parse_upstream
from gateway.types import Receive, Scope, Send

log = logging.getLogger("obleth.proxy")

RETRY_BODY_BYTES = 8 * 1024 * 1024
"""Default bound on the request body held in memory so that a retry can send it again."""

_NOBODY = TrustedProxies()

Answered = Callable[[str, str], None]
"""``answered(upstream, status)``: what an attempt got, ``status`` an HTTP status or
``"error"``."""


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
    trusted = trusted_proxies if trusted_proxies is not None else _NOBODY
    headers = as_text(upstream_headers(scope, trusted))
    inbound = Inbound(receive)
    try:
        content = await inbound.content(hold_up_to=retry_body_bytes if route is not None else 0)
    except Disconnected:
        return
    # only a body held whole, within the bound, can be sent a second time
    if isinstance(content, Inbound) or len(content or b"") > retry_body_bytes:
        route = None
    request = Outbound(session, scope, headers, content, response_timeout_s)
    client_send = ClientSend(send)
    tell = None if answered is None or upstream is None else _Telling(answered, upstream, route)
    relay = asyncio.ensure_future(_relay(request, url, route, client_send, read_timeout_s, tell))
    watch = asyncio.ensure_future(inbound.disconnected())
    try:
        await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
        if not relay.done():
            # the client left, mid-upload or mid-response: the seat this request holds is
            # given back once the upstream has dropped the request too, not while it still
            # runs it
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


async def _relay(
    upstream: Outbound,
    url: URL,
    route: Reroutable | None,
    send: ClientSend,
    read_timeout_s: float | None,
    tell: _Telling | None,
) -> None:
    outcome: Outcome | None = None
    try:
        outcome = await upstream.send_to(url)
        if send.gone and isinstance(outcome, UpstreamFailure):
            return  # the hang-up's doing (the client left first): nobody to answer or retry
        if tell is not None:
            tell.first(outcome)
        if not send.gone and route is not None and worth_retrying(upstream.method, _got(outcome)):
            # a 5xx is kept open until the route has answered: with nowhere else to go,
            # the client gets the upstream's own answer
            retry_url = _next_upstream(route, upstream, url, outcome)
            if retry_url is not None:
                _discard(outcome)
                url = retry_url
                outcome = await upstream.send_to(url)
                if send.gone and isinstance(outcome, UpstreamFailure):
                    return
                if tell is not None:
                    tell.again(outcome)
        if isinstance(outcome, UpstreamFailure):
            await answer_failure(send, _origin(url), outcome)
        else:
            await _stream_back(outcome, url, upstream, send, read_timeout_s)
    finally:
        upstream.stop_watching()
        if outcome is not None:
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


def _got(outcome: Outcome) -> int | UpstreamFailure:
    return outcome if isinstance(outcome, UpstreamFailure) else outcome.status


def _next_upstream(
    route: Reroutable, upstream: Outbound, failed: URL, outcome: Outcome
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


#: statuses whose responses have no body
_NO_BODY = frozenset({204, 304})


async def _stream_back(
    response: aiohttp.ClientResponse,
    url: URL,
    request: Outbound,
    send: ClientSend,
    read_timeout_s: float | None,
) -> None:
    """Relay ``response`` (to ``request``, sent to ``url``) to the client, cut short (no
    final message) when the upstream fails, goes silent for ``read_timeout_s``, or stops
    taking a body still being streamed to it (``request.writes``). A ``Location`` on the
    upstream itself is told as the gateway's (``client_location``)."""
    silence = None if read_timeout_s is None else Watchdog(read_timeout_s)
    writes = request.writes
    headers = [
        (name, client_location(value, url, request.scope) if name == b"location" else value)
        for name, value in to_client(response.raw_headers)
    ]
    if response.status in _NO_BODY:
        # a 304's Content-Length is the length of the body it stands for (RFC 9110, 8.6):
        # passed on, the server would wait for that many bytes, which never come
        headers = [(name, value) for name, value in headers if name != b"content-length"]
    try:
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        # the bytes as the upstream encoded them (the session never decodes), matching its
        # Content-Length and Content-Encoding, which are forwarded unchanged
        read = response.content.readany
        while True:
            if silence is not None:
                silence.start()
                chunk = await read()
                silence.pause()
            else:
                chunk = await read()
            if not chunk:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if writes is not None:
            writes.stop()  # the answer is whole: what is left of the body no longer matters
    except aiohttp.ClientError as exc:
        if not send.gone:  # else the upstream closed because we told it to
            _log_cut_short(url, describe(exc))
        return  # without the final message: the server closes the connection
    except asyncio.CancelledError:
        # evaluated both: each takes back its own cancellation
        silent = silence is not None and silence.expired()
        stalled = writes is not None and writes.expired()
        if not (silent or stalled):
            raise
        if silent:
            _log_cut_short(url, f"sent nothing for {read_timeout_s} s")
        else:
            assert writes is not None
            _log_cut_short(url, f"took none of the request body for {writes.limit_s} s")
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
