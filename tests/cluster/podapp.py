"""The app one pod of the test cluster serves: the gateway in front of the streaming proxy.

Run by ``tests/cluster/pods.py`` as
``python -m uvicorn tests.cluster.podapp:create_app --factory`` with the settings in
``OBLETH_*`` variables and the upstream's base URL in ``POD_UPSTREAM``; ``POD_PLUGINS``
names modules to register as plugins (comma-separated), for tests that bring their own.

Besides the proxied paths, a pod answers these of its own:

- ``GET /healthz``: 200, inside the gateway but exempt from admission (the default
  ``exempt_paths``), so it answers even when every seat is taken;
- ``GET /_pod/stats``: the gate's counters as JSON, served before the gateway so that
  reading them never touches what they count; in cluster mode also the backend's
  ``mode``, ``reasserted``, ``held`` and ``live_pods``;
- ``PUT /_pod/capacity?limit=N``: ``gateway.set_capacity(N)`` (what the admin API will
  do), served before the gateway;
- ``GET /_pod/status``: what ``GET /api/v1/status`` answers, without a token;
- ``POST /_pod/raise``: admitted like any request, then the app raises (an app bug).
"""

from __future__ import annotations

import importlib
import json
import os
from urllib.parse import parse_qsl

from gateway import Gateway, GatewayMiddleware, Settings
from gateway.admin.status import status
from gateway.proxy import proxy_to
from gateway.types import ASGIApp, Receive, Scope, Send

STATS_PATH = "/_pod/stats"
CAPACITY_PATH = "/_pod/capacity"
STATUS_PATH = "/_pod/status"
RAISE_PATH = "/_pod/raise"
HEALTH_PATH = "/healthz"


def create_app() -> ASGIApp:
    """The pod's ASGI app; raises at startup when ``POD_UPSTREAM`` or a setting is wrong."""
    upstream = os.environ.get("POD_UPSTREAM", "")
    if not upstream:
        raise RuntimeError(
            "POD_UPSTREAM is not set: give the base URL of the backend this pod proxies to, "
            "e.g. POD_UPSTREAM=http://127.0.0.1:8001"
        )
    names = os.environ.get("POD_PLUGINS", "")
    plugins = [importlib.import_module(name) for name in names.split(",") if name]
    gateway = Gateway(Settings.from_env(), plugins=plugins)
    gated = GatewayMiddleware(_Healthz(_Raises(proxy_to(upstream))), gateway=gateway)
    return _PodStats(gated, gateway)


async def _send_json(send: Send, payload: object) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _PodStats:
    """Answers ``GET /_pod/stats`` with the gateway's counters; passes the rest on."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CAPACITY_PATH:
            query = dict(parse_qsl(scope["query_string"].decode()))
            self.gateway.set_capacity(int(query["limit"]))
            await _send_json(send, {"limit": int(query["limit"])})
            return
        if scope["type"] == "http" and scope["path"] == STATUS_PATH:
            await _send_json(send, status(self.gateway))
            return
        if scope["type"] != "http" or scope["path"] != STATS_PATH:
            await self.app(scope, receive, send)
            return
        scheduler = self.gateway.scheduler
        snapshot = self.gateway.snapshot()
        backend = self.gateway.backend
        cluster = {
            name: getattr(backend, name)
            for name in ("pod", "mode", "reasserted", "held", "live_pods")
            if hasattr(backend, name)
        }
        await _send_json(
            send,
            {
                **cluster,
                "pid": os.getpid(),
                "admitted": scheduler.admitted,
                "released": scheduler.released,
                "rejected": dict(scheduler.rejected),
                "limit": snapshot.limit,
                "inflight": snapshot.inflight,
                "queued": snapshot.queued,
            },
        )


class _Healthz:
    """Answers ``GET /healthz`` with 200; proxies everything else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        await _send_json(send, {"status": "ok"})


class _Raises:
    """``POST /_pod/raise`` raises inside the app, after admission; the rest passes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == RAISE_PATH:
            raise RuntimeError("the app failed (on purpose, for a test)")
        await self.app(scope, receive, send)
