"""``Probes``: liveness, readiness and the metrics page, answered by the gateway itself,
never queued nor forwarded.

``obleth serve`` puts it outermost; an application using ``GatewayMiddleware`` mounts it
the same way, around the middleware: ``Probes(GatewayMiddleware(app), middleware.gateway)``.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.asgi.responses import send_json
from gateway.gateway import Gateway
from gateway.types import ASGIApp, Receive, Scope, Send

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"

METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format, as every Prometheus version scrapes it."""

#: readiness fails once this share of ``max_queue`` waits, so that a load balancer sends
#: new traffic to other pods before this one has to turn requests away
READY_QUEUE_SHARE = 0.8


class Probes:
    """Answers three paths itself, whatever the method; everything else goes to ``app``.

    - ``/healthz``: ``200 {"status": "alive"}`` while the process runs.
    - ``/readyz``: ``200`` when the gateway has started, at least one upstream is healthy
      (when upstreams are configured) and fewer requests wait than 80 % of ``max_queue``;
      ``503`` otherwise. The body says why: ``{"healthy_upstreams": [...], "queued": n}``.
    - ``/metrics``: ``200`` with ``metrics()``, Prometheus text; ``metrics`` is called once
      per scrape, on the event loop, so it must answer from memory. Without ``metrics``,
      the path goes to ``app`` like any other.
    """

    def __init__(
        self, app: ASGIApp, gateway: Gateway, metrics: Callable[[], bytes] | None = None
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path == HEALTH_PATH:
            await send_json(send, 200, {"status": "alive"})
        elif path == READY_PATH:
            await self._ready(send)
        elif path == METRICS_PATH and self.metrics is not None:
            await self._metrics(self.metrics(), send)
        else:
            await self.app(scope, receive, send)

    async def _ready(self, send: Send) -> None:
        readings = self.gateway.readings
        healthy = [u for u in readings if readings.get(u).healthy]
        snapshot = self.gateway.snapshot()
        backed_up = (
            snapshot.max_queue > 0 and snapshot.queued >= READY_QUEUE_SHARE * snapshot.max_queue
        )
        routed = len(readings) > 0
        ready = (bool(healthy) or not routed) and self.gateway.started and not backed_up
        payload = {"healthy_upstreams": healthy, "queued": snapshot.queued}
        await send_json(send, 200 if ready else 503, payload)

    async def _metrics(self, body: bytes, send: Send) -> None:
        headers = [
            (b"content-type", METRICS_CONTENT_TYPE),
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
