"""``Probes``: liveness, readiness and the metrics page, answered by the gateway itself,
never queued nor forwarded.

``obleth serve`` puts it outermost, on the gateway's port and on the admin port; an
application using ``GatewayMiddleware`` mounts it the same way, around the middleware:
``Probes(GatewayMiddleware(app), middleware.gateway)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.asgi.responses import send_json, send_not_allowed
from gateway.complaints import Complaints
from gateway.core.exemptions import route_path
from gateway.gateway import Gateway
from gateway.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("obleth")

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
_PROBES = frozenset((HEALTH_PATH, READY_PATH, METRICS_PATH))

METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format, as every Prometheus version scrapes it."""

#: readiness fails once this share of ``max_queue`` waits, so that a load balancer sends
#: new traffic to other pods before this one has to turn requests away
READY_QUEUE_SHARE = 0.8


def readiness(gateway: Gateway) -> tuple[int, dict[str, object]]:
    """``/readyz``'s status and body: 200 when nothing below holds, else 503, with each
    reason that holds in ``not_ready``.

    - the gateway has not started (or has stopped);
    - upstreams are configured and none is healthy;
    - at least 80 % of ``max_queue`` waits;
    - cluster mode, ``redis_failure_mode=closed``, and Redis cannot be reached: the pod
      refuses every new request, so the load balancer should send them elsewhere.
    """
    readings = gateway.readings
    healthy = [u for u in readings if readings.get(u).healthy]
    snapshot = gateway.snapshot()
    reasons = []
    if not gateway.started:
        reasons.append("the gateway has not started")
    if len(readings) > 0 and not healthy:
        reasons.append("no upstream is healthy")
    if snapshot.max_queue > 0 and snapshot.queued >= READY_QUEUE_SHARE * snapshot.max_queue:
        reasons.append(f"the queue holds {READY_QUEUE_SHARE:.0%} of max_queue or more")
    if getattr(gateway.backend, "mode", None) == "closed":
        reasons.append("Redis cannot be reached and redis_failure_mode is closed")
    body: dict[str, object] = {"healthy_upstreams": healthy, "queued": snapshot.queued}
    if reasons:
        body["not_ready"] = reasons
    return (503 if reasons else 200), body


class Probes:
    """Answers three paths itself; everything else goes to ``app``. They take GET and HEAD
    (GET's status and headers, no body); any other method gets ``405 bad_method`` with an
    ``Allow`` header, as the admin API answers.

    - ``/healthz``: ``200 {"status": "alive"}`` while the process runs.
    - ``/readyz``: ``200`` when the gateway is ready for traffic, ``503`` otherwise (see
      ``readiness``); the body says why: ``{"healthy_upstreams": [...], "queued": n}``
      and, when not ready, ``"not_ready": [reasons]``. A gateway that has not started
      (served without lifespan, as ``uvicorn --lifespan off``) is started first, as the
      first request it admits would start it, so that a load balancer that waits for
      readiness before sending anything does not wait forever; if it cannot start,
      ``503`` with ``"not_ready": ["the gateway could not start: <the error>"]`` (and the
      error in the log, at most once a minute), ``healthy_upstreams`` empty and
      ``queued`` 0.
    - ``/metrics``: ``200`` with ``metrics()``, Prometheus text; ``metrics`` is called once
      per scrape, on the event loop, so it must answer from memory. Without ``metrics``,
      the path goes to ``app`` like any other.

    The paths are matched below the server's ``root_path`` (``uvicorn --root-path /gw``
    answers ``/gw/healthz``), as the middleware's ``exempt_paths`` are.
    """

    def __init__(
        self, app: ASGIApp, gateway: Gateway, metrics: Callable[[], bytes] | None = None
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.metrics = metrics
        self._complaints = Complaints()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope) if scope["type"] == "http" else None
        if path is None or path not in _PROBES or (path == METRICS_PATH and not self.metrics):
            await self.app(scope, receive, send)
        elif scope["method"] not in ("GET", "HEAD"):
            await send_not_allowed(send, scope["method"], ("GET", "HEAD"))
        elif path == HEALTH_PATH:
            await send_json(send, 200, {"status": "alive"})
        elif path == READY_PATH:
            await self._ready(send)
        else:
            assert self.metrics is not None
            await self._metrics(self.metrics(), send)

    async def _ready(self, send: Send) -> None:
        if not self.gateway.started:
            problem = await self._start()
            if problem is not None:
                body = {"healthy_upstreams": [], "queued": 0, "not_ready": [problem]}
                await send_json(send, 503, body)
                return
        await send_json(send, *readiness(self.gateway))

    async def _start(self) -> str | None:
        """Start the gateway (shared with any start under way, see ``Gateway.start``);
        None once started, else the reason it cannot be. The gateway may be one that could
        not even be assembled (``GatewayMiddleware`` built while the loop ran, with a bad
        setting): its ``start()`` raises that error, and nothing else of it may be read."""
        try:
            await self.gateway.start()
        except Exception as exc:
            if self._complaints.may("start"):
                log.error("the gateway could not start, so it is not ready: %s", exc)
            return f"the gateway could not start: {exc}"
        return None

    async def _metrics(self, body: bytes, send: Send) -> None:
        headers = [
            (b"content-type", METRICS_CONTENT_TYPE),
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
