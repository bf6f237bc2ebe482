"""``ProxyApp``: the streaming reverse proxy as a plain ASGI app, and ``proxy_to``."""

from __future__ import annotations

import logging
import math

import httpx

from gateway.asgi.responses import send_json_error
from gateway.errors import ConfigError
from gateway.proxy.client import upstream_client
from gateway.proxy.exchange import forward
from gateway.proxy.upstream import (
    UpstreamChoice,
    parse_upstream,
    routed_upstream,
    target_url,
)
from gateway.types import Receive, Scope, Send

log = logging.getLogger("obleth.proxy")

_ROUTED = "scope['state']['obleth']['upstream']"


class ProxyApp:
    """Forwards every HTTP request to an upstream and streams the answer back.

    Method, path, query string, headers (without hop-by-hop ones; ``host`` becomes the
    upstream's) and body go to the upstream as the client sent them; status, headers and
    body come back as the upstream sent them, chunk by chunk. ``gateway.proxy.exchange``
    says what happens when the client disconnects or the upstream fails (502/503 JSON
    errors before the response has started, a cut-short response after).

    Which upstream is the one decision a router takes over: ``choose_upstream(scope)``
    returns a base URL. By default it is the router's choice in
    ``scope["state"]["obleth"]["upstream"]`` when there is one, else ``upstream``. Pass
    ``choose=`` (or assign ``choose_upstream``) to decide differently; it is called on the
    request path, so no I/O.

    All requests share one HTTP client (see ``gateway.proxy.client``): lifespan startup
    opens it, lifespan shutdown closes it. Without a lifespan it opens on the first request
    and whoever owns the app calls ``aclose()``. WebSocket connections are refused.

    A bad ``upstream`` or option raises ``ConfigError`` here, not on a request.
    """

    def __init__(
        self,
        upstream: str,
        *,
        choose: UpstreamChoice | None = None,
        connect_timeout_s: float = 5.0,
        max_connections: int = 1024,
    ) -> None:
        parse_upstream(upstream)
        if isinstance(connect_timeout_s, bool) or not isinstance(connect_timeout_s, int | float):
            raise ConfigError("connect_timeout_s", connect_timeout_s, "expected seconds, e.g. 5")
        if not math.isfinite(connect_timeout_s) or connect_timeout_s <= 0:
            raise ConfigError(
                "connect_timeout_s",
                connect_timeout_s,
                "expected a finite number of seconds above 0",
            )
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ConfigError("max_connections", max_connections, "expected a whole number")
        if max_connections < 1:
            raise ConfigError("max_connections", max_connections, "expected at least 1")
        self.upstream = upstream
        self.choose_upstream: UpstreamChoice = (
            choose if choose is not None else self._routed_or_configured
        )
        self._connect_timeout_s = float(connect_timeout_s)
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._forward(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            # closing before accepting makes the server refuse the handshake (403)
            await send({"type": "websocket.close", "code": 1000})

    async def aclose(self) -> None:
        """Close the shared HTTP client and its connections; a later request opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _routed_or_configured(self, scope: Scope) -> str:
        return routed_upstream(scope) or self.upstream

    def _client_now(self) -> httpx.AsyncClient:
        client = self._client
        if client is None:
            client = self._client = upstream_client(
                connect_timeout_s=self._connect_timeout_s, max_connections=self._max_connections
            )
        return client

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        chosen = self.choose_upstream(scope)
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
        await forward(self._client_now(), target_url(base, scope), scope, receive, send)

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
    upstream: str, *, connect_timeout_s: float = 5.0, max_connections: int = 1024
) -> ProxyApp:
    """The streaming proxy to ``upstream``, ready to wrap:
    ``GatewayMiddleware(proxy_to("http://vllm-0:8000"))``. See ``ProxyApp``."""
    return ProxyApp(upstream, connect_timeout_s=connect_timeout_s, max_connections=max_connections)
