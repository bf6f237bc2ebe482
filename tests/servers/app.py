"""The app of the server tests: the gateway in front of a handler that holds every request
for a while and writes down when it starts and stops holding it.

Served by uvicorn, hypercorn, granian and gunicorn as ``tests.servers.app:app``, settings
from ``OBLETH_*`` variables. ``app`` builds the gateway on the first event the server sends
(lifespan startup), the way Starlette and FastAPI build their middleware, so a bad setting
reaches the server through ``lifespan.startup.failed``; ``tests.servers.built_at_import``
builds the same app while its module is imported.

Around the gateway, ``Probes`` answers ``/healthz`` and ``/readyz`` (200 once the gateway
has started; the body's ``queued`` is how many requests wait). Every other request is
admitted by the gateway, then held by ``Held``:

- ``?ms=N``: for N milliseconds (at most 10 000);
- ``?gate``: for as long as the file named by ``SERVER_TEST_GATE`` exists (giving up
  after some 20 s), so that a test decides when held requests may finish.

Each holding is written to the file named by ``SERVER_TEST_LEDGER``, one line when it
starts (``+ <pid>``) and one when it ends (``- <pid>``), appended by every process of the
server: the most lines ``+`` ahead of ``-`` is the most requests the app held at once,
across worker processes too (``tests.servers.ledger`` reads it). The answer is 200
``{"pid": <pid>, "tenant": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from urllib.parse import parse_qs

from gateway import GatewayMiddleware
from gateway.admin.health import Probes
from gateway.types import ASGIApp, Receive, Scope, Send

LEDGER = "SERVER_TEST_LEDGER"
GATE = "SERVER_TEST_GATE"
_MAX_MS = 10_000
_MAX_GATE_S = 20.0
_GATE_POLL_S = 0.01


class Held:
    """Holds each HTTP request (see the module docstring) and speaks lifespan."""

    def __init__(self) -> None:
        self._ledger: int | None = None
        self._gate = Path(os.environ[GATE]) if GATE in os.environ else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        query = parse_qs(scope["query_string"].decode(), keep_blank_values=True)
        self._write(b"+")
        try:
            if "gate" in query:
                await self._wait_for_gate()
            else:
                ms = min(int(query.get("ms", ["0"])[0]), _MAX_MS)
                await asyncio.sleep(ms / 1000)
        finally:
            self._write(b"-")
        admitted = scope.get("state", {}).get("obleth", {})
        body = json.dumps({"pid": os.getpid(), "tenant": admitted.get("tenant")}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _wait_for_gate(self) -> None:
        gate = self._gate
        if gate is None:
            return
        # a file another process removes: polled, a bounded number of times
        for _ in range(round(_MAX_GATE_S / _GATE_POLL_S)):
            if not await asyncio.to_thread(gate.exists):
                return
            await asyncio.sleep(_GATE_POLL_S)

    def _write(self, sign: bytes) -> None:
        """One line of the ledger; ``O_APPEND`` keeps lines from several processes whole
        and in the order they were written."""
        if self._ledger is None:
            self._ledger = os.open(os.environ[LEDGER], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(self._ledger, sign + b" %d\n" % os.getpid())


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def gated() -> Probes:
    """``Held`` behind the gateway (settings from ``OBLETH_*``), the probes around it."""
    middleware = GatewayMiddleware(Held())
    return Probes(middleware, middleware.gateway)


class BuiltAtStartup:
    """``gated()``, built on the first event the server sends, inside its event loop."""

    def __init__(self) -> None:
        self._app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = gated()
        await self._app(scope, receive, send)


app = BuiltAtStartup()
