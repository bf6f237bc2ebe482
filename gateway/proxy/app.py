"""``ProxyApp``: the streaming reverse proxy as a plain ASGI app, and ``proxy_to``."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import aiohttp

from gateway.asgi.responses import refuse_websocket, send_json_error
from gateway.core.networks import ProxyListError, parse_networks
from gateway.errors import ConfigError
from gateway.proxy.client import MAX_HEADER_BYTES, upstream_session
from gateway.proxy.exchange import RETRY_BODY_BYTES, Answered, forward
from gateway.proxy.forwarding import TrustedProxies
from gateway.proxy.upstream import (
    UpstreamChoice,
    route_of,
    routed_upstream,
    target_url,
    unforwardable_path,
)
from gateway.routing.upstreams import parse_upstream
from gateway.types import Receive, Scope, Send

log = logging.getLogger("obleth.proxy")

_ROUTED = "scope['state']['obleth']['upstream']"


class ProxyApp:
    """Forwards every HTTP request to an upstream and streams the answer back.

    Method, path, query string, headers (without hop-by-hop ones; ``host`` becomes the
    upstream's; ``X-Forwarded-For``, ``-Host`` and ``-Proto`` are this hop's, see
    ``trusted_proxies``) and body go to the upstream as the client sent them; status,
    headers and body come back as the upstream sent them, chunk by chunk, but for a
    ``Location`` on the upstream itself, told as the same path on the gateway
    (``gateway.proxy.upstream.client_location``). ``gateway.proxy.exchange`` says what
    happens when the client disconnects, when the upstream fails or is too slow
    (502/503/504 JSON errors before the response has started, a cut-short response after),
    and when a request is retried.

    Which upstream is the one decision a router takes over: ``choose_upstream(scope)``
    returns a base URL, or None for none. By default it is the router's choice in
    ``scope["state"]["obleth"]["upstream"]`` when there is one, else the ``upstream`` of
    the router's ``Reroutable`` in ``scope["state"]["obleth"]["route"]``, else
    ``upstream``. Pass ``choose=`` (or assign ``choose_upstream``) to decide differently;
    it is called on the request path, so no I/O. A request left without an upstream (no
    ``upstream`` configured and none routed) is answered 503 ``no_upstream``.

    With a ``Reroutable`` in the scope, a request that failed upstream before anything was
    sent to the client, and that the upstream provably did not run (or whose method is
    idempotent; see ``gateway.proxy.retries``), is sent once more, to the route's
    next-best upstream; without one, there is no retry. Options, in seconds where they are times:

    - ``connect_timeout_s``: connecting, and waiting for a free pooled connection.
    - ``response_timeout_s``: from the request written to the response headers received;
      exceeded, 504 ``upstream_timeout`` and no retry. A non-streamed completion gets its
      headers only with the whole answer, so for those this bounds the generation too.
      Also the longest the upstream may take none of a streamed request body, before or
      after it started answering (after, the response is cut short). None: no limit.
    - ``read_timeout_s``: the longest silence between two response body chunks; exceeded,
      the response is cut short. None: no limit.
    - ``retry_body_bytes``: a request body up to this size is held in memory so that the
      retry can send it again; a larger body is streamed and its request never retried.
    - ``max_connections``: upstream connections open at once, all upstreams together.
    - ``max_header_bytes``: the longest status line and header line of a response the
      proxy reads (give it the bound on request heads, so an upstream may answer with
      headers as large as the client sent); a response over it is answered 502
      ``upstream_bad_response``, and never retried (the request ran).
    - ``trusted_proxies``: IP addresses or CIDR networks of the peers (load balancers,
      other proxies) whose ``X-Forwarded-*`` and ``Forwarded`` headers are believed; see
      ``gateway.proxy.forwarding`` for the headers every forwarded request carries.
    - ``answered(upstream, status)``: called once per attempt with the upstream (as chosen)
      and its answer's status, ``"error"`` when it failed before answering; the gateway's
      ``answers`` tallies, for ``obleth_upstream_requests_total``. On the request path.

    All requests share one HTTP client (see ``gateway.proxy.client``): lifespan startup
    opens it, lifespan shutdown closes it. Without a lifespan it opens on the first request
    and whoever owns the app calls ``aclose()``. WebSocket connections are refused.

    A bad ``upstream`` or option raises ``ConfigError`` here, not on a request.
    """

    def __init__(
        self,
        upstream: str | None = None,
        *,
        choose: UpstreamChoice | None = None,
        connect_timeout_s: float = 5.0,
        response_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        retry_body_bytes: int = RETRY_BODY_BYTES,
        max_connections: int = 1024,
        max_header_bytes: int = MAX_HEADER_BYTES,
        trusted_proxies: Iterable[str] = (),
        answered: Answered | None = None,
    ) -> None:
        if upstream is not None:
            parse_upstream(upstream)
        self.upstream = upstream
        self.choose_upstream: UpstreamChoice = (
            choose if choose is not None else self._routed_or_configured
        )
        self._connect_timeout_s = _seconds("connect_timeout_s", connect_timeout_s)
        self._response_timeout_s = _seconds_or_none("response_timeout_s", response_timeout_s)
        self._read_timeout_s = _seconds_or_none("read_timeout_s", read_timeout_s)
        self._retry_body_bytes = _count("retry_body_bytes", retry_body_bytes, minimum=0)
        self._max_connections = _count("max_connections", max_connections, minimum=1)
        self._max_header_bytes = _count("max_header_bytes", max_header_bytes, minimum=1024)
        self._trusted = _trusted("trusted_proxies", trusted_proxies)
        self._answered = answered
        self._client: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._forward(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await refuse_websocket(scope, receive, send, WEBSOCKET_REFUSED)

    async def aclose(self) -> None:
        """Close the shared HTTP client and its connections; a later request opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _routed_or_configured(self, scope: Scope) -> str | None:
        chosen = routed_upstream(scope)
        if chosen is None:
            route = route_of(scope)
            chosen = route.upstream if route is not None else None
        return chosen or self.upstream

    def _client_now(self) -> aiohttp.ClientSession:
        client = self._client
        if client is None:
            client = self._client = upstream_session(
                connect_timeout_s=self._connect_timeout_s,
                max_connections=self._max_connections,
                max_header_bytes=self._max_header_bytes,
            )
        return client

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = unforwardable_path(scope)
        if refused is not None:
            await send_json_error(send, 400, refused, code="invalid_path")
            return
        chosen = self.choose_upstream(scope)
        if chosen is None:
            log.error(
                "cannot forward %s %s: no router chose an upstream and none is configured",
                scope["method"],
                scope["path"],
            )
            await send_json_error(
                send,
                503,
                "the gateway has no upstream for this request; retry later",
                code="no_upstream",
            )
            return
        try:
            base = parse_upstream(chosen, _ROUTED)
        except ConfigError as exc:
            log.error("cannot forward %s %s: %s", scope["method"], scope["path"], exc)
            await send_json_error(
                send,
                502,
                "the gateway has no usable upstream for this request",
                code="bad_upstream",
            )
            return
        await forward(
            self._client_now(),
            target_url(base, scope),
            scope,
            receive,
            send,
            route=route_of(scope),
            retry_body_bytes=self._retry_body_bytes,
            response_timeout_s=self._response_timeout_s,
            read_timeout_s=self._read_timeout_s,
            trusted_proxies=self._trusted,
            upstream=chosen,
            answered=self._answered,
        )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._client_now()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def proxy_to(
    upstream: str,
    *,
    connect_timeout_s: float = 5.0,
    response_timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    retry_body_bytes: int = RETRY_BODY_BYTES,
    max_connections: int = 1024,
    max_header_bytes: int = MAX_HEADER_BYTES,
    trusted_proxies: Iterable[str] = (),
) -> ProxyApp:
    """The streaming proxy to ``upstream``, ready to wrap:
    ``GatewayMiddleware(proxy_to("http://vllm-0:8000"))``. See ``ProxyApp``."""
    return ProxyApp(
        upstream,
        connect_timeout_s=connect_timeout_s,
        response_timeout_s=response_timeout_s,
        read_timeout_s=read_timeout_s,
        retry_body_bytes=retry_body_bytes,
        max_connections=max_connections,
        max_header_bytes=max_header_bytes,
        trusted_proxies=trusted_proxies,
    )


def _seconds(option: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(option, value, "expected seconds, e.g. 5")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(option, value, "expected a finite number of seconds above 0")
    return float(value)


def _seconds_or_none(option: str, value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return _seconds(option, value)
    except ConfigError as exc:
        raise ConfigError(option, value, f"{exc.expected}, or None for no limit") from None


def _trusted(option: str, entries: Iterable[str]) -> TrustedProxies:
    if isinstance(entries, str):
        entries = [part for part in entries.split(",") if part.strip()]
    try:
        return TrustedProxies(parse_networks(entries))
    except ProxyListError as exc:
        raise ConfigError(option, exc.entry, str(exc)) from None


def _count(option: str, value: int, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(option, value, "expected a whole number")
    if value < minimum:
        raise ConfigError(option, value, f"expected at least {minimum}")
    return value


WEBSOCKET_REFUSED = (
    "the gateway does not forward WebSocket connections; send HTTP requests (with "
    '"stream": true for an answer token by token)'
)
