"""The one HTTP client session a proxy shares across all its requests, sized for long
streams, and what an attempt that got no response got instead.

Why aiohttp and not httpx, which the rest of the gateway uses for its few requests of its
own: forwarding is the request path. Measured at saturation on the same machine, a bare
ASGI forwarder spent 1.6 ms of CPU per request through httpx (its connection pool scans
and polls every pooled connection on each request) and 0.2 ms through aiohttp (a C
parser, a pool keyed by host); the proxy's whole budget is 0.5 ms (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any, Literal

import aiohttp

from gateway.asgi.responses import send_json_error
from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from gateway.types import Send

log = logging.getLogger("obleth.proxy")

#: headers aiohttp would add of its own: the upstream gets the client's, or none
_NOT_ADDED = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")

FailureKind = Literal["unreachable", "exhausted", "timeout", "failed", "malformed"]
"""``unreachable``: no connection could be made (refused, connect timeout); ``exhausted``:
every pooled connection stayed busy for the connect timeout; ``timeout``: no response
headers within the response timeout; ``failed``: connected, but the connection broke
before an answer came (closed, reset); ``malformed``: the upstream answered, with a
response head the proxy cannot read (no HTTP, or over the session's bounds)."""


class UpstreamFailure(Exception):
    """What an attempt got instead of response headers.

    ``sent``: whether any of the request had been handed to the connection when it
    failed. When not, the upstream cannot have run the request, whatever its method.
    """

    def __init__(self, kind: FailureKind, detail: str, *, sent: bool = True) -> None:
        self.kind: FailureKind = kind
        self.sent = sent
        super().__init__(detail)


class Attempt:
    """Per-request state the session's trace callbacks update (pass it as
    ``trace_request_ctx``): whether the attempt waits for a pooled connection now, whether
    the request head has been handed to the connection (``sent``; aiohttp says so just
    before it writes it), and what to call then. ``connection``: the connection the
    request went out on, once it has one (set by the connector while ``CURRENT`` names
    the attempt), so that the client's leaving can be told to the upstream before any
    response has come."""

    __slots__ = ("connection", "headers_sent", "queued", "sent")

    def __init__(self, headers_sent: Callable[[], None] | None) -> None:
        self.queued = False
        self.sent = False
        self.headers_sent = headers_sent
        self.connection: aiohttp.connector.Connection | None = None


CURRENT: ContextVar[Attempt | None] = ContextVar("obleth_proxy_attempt", default=None)
"""The attempt whose request the session is sending in this task (see ``Attempt``)."""


MAX_HEADER_BYTES = 64 * 1024
"""Default bound on a response's status line and on each of its header lines: the default
``max_header_bytes``, the bound on the request heads the gateway accepts, so an upstream
may answer with headers as large as the ones the client may send (aiohttp's own default,
8190 bytes, refused whole answers whose request had run)."""


def upstream_session(
    *, connect_timeout_s: float, max_connections: int, max_header_bytes: int = MAX_HEADER_BYTES
) -> aiohttp.ClientSession:
    """A session for forwarding: pooled keep-alive connections, no read timeout.

    - No read timeout: a completion may stream for minutes. The proxy's own
      ``response_timeout_s`` and ``read_timeout_s`` (see ``gateway.proxy.exchange``) bound
      the waits on the upstream.
    - ``connect_timeout_s`` bounds both connecting and waiting for a free pooled
      connection, so an unreachable or saturated upstream is answered, not waited on.
    - Up to ``max_connections`` connections, all upstreams together, each kept alive
      between requests until idle for ``KEEPALIVE_EXPIRY_S``.
    - The environment is ignored (no proxy variables), no cookies are kept (a
      ``Set-Cookie`` of one client's response must never reach another's request), the body
      is never decoded (it is relayed as the upstream encoded it), redirects are not
      followed (callers pass ``allow_redirects=False``: they are answers for the client),
      and no header the client did not send is added but ``Host`` and the body's framing.
    - A response's status line and each of its header lines may take up to
      ``max_header_bytes``, and it may have as many header lines as fit in that many bytes
      (aiohttp bounds lines and their count, not the whole head). A response over these
      bounds fails with ``aiohttp.ClientResponseError``, as one that is no HTTP does.
    """
    trace = aiohttp.TraceConfig(trace_config_ctx_factory=SimpleNamespace)
    trace.on_connection_queued_start.append(_queued)
    trace.on_connection_queued_end.append(_dequeued)
    trace.on_request_headers_sent.append(_headers_sent)
    connector = _QuietReuse(
        limit=max_connections,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_EXPIRY_S,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=_NOT_ADDED,
        trace_configs=[trace],
        max_line_size=max_header_bytes,
        max_field_size=max_header_bytes,
        # the shortest header line, "a:" and its CRLF, takes 4 bytes
        max_headers=max_header_bytes // 4,
    )


class _QuietReuse(aiohttp.TCPConnector):
    """aiohttp's connector, reusing no pooled connection that spoke while it was idle.

    An upstream that sends bytes nobody asked for (a second response after a whole one)
    leaves them in the idle connection, and aiohttp would read them as the answer to the
    next request sent on it, another client's. Such a connection is closed and the next
    one in the pool tried, as nginx closes a kept-alive upstream connection that speaks.
    ``_get`` is aiohttp's own (private) way into the pool; its signature has been the same
    since 3.10.11, the lowest version Obleth accepts. ``connect`` (public) also tells the
    current ``Attempt`` which connection it got."""

    async def connect(self, *args: Any, **kwargs: Any) -> aiohttp.connector.Connection:
        connection = await super().connect(*args, **kwargs)
        attempt = CURRENT.get()
        if attempt is not None:
            attempt.connection = connection
        return connection

    async def _get(self, key: Any, traces: Any) -> Any:
        while (connection := await super()._get(key, traces)) is not None:
            protocol = connection.protocol
            if protocol is not None and not protocol.should_close:
                return connection
            connection.close()
        return None


async def _queued(session: object, context: SimpleNamespace, params: object) -> None:
    context.trace_request_ctx.queued = True


async def _dequeued(session: object, context: SimpleNamespace, params: object) -> None:
    context.trace_request_ctx.queued = False


async def _headers_sent(session: object, context: SimpleNamespace, params: object) -> None:
    attempt = context.trace_request_ctx
    attempt.sent = True
    then = attempt.headers_sent
    if then is not None:
        then()


_FAILURE_ANSWERS = {
    "exhausted": (
        503,
        "upstream_connections_exhausted",
        "every connection to the upstream inference server is busy; retry later",
    ),
    "unreachable": (
        502,
        "upstream_unreachable",
        "the upstream inference server could not be reached; retry later",
    ),
    "timeout": (
        504,
        "upstream_timeout",
        "the upstream inference server did not start answering in time; retry later",
    ),
    "failed": (
        502,
        "upstream_failed",
        "the upstream inference server failed before answering; retry later",
    ),
    "malformed": (
        502,
        "upstream_bad_response",
        "the upstream inference server sent an answer the gateway cannot read",
    ),
}


async def answer_failure(send: Send, origin: str, failure: UpstreamFailure) -> None:
    """The client's answer to an attempt that got no response: an OpenAI-style JSON error
    whose code says what kind of failure it was (where and why goes to the log)."""
    status, code, message = _FAILURE_ANSWERS[failure.kind]
    # the client learns what kind of failure it was; where and why is for the operator
    log.warning("upstream %s: %s; answered %d %s", origin, failure, status, code)
    await send_json_error(send, status, message, code=code)
