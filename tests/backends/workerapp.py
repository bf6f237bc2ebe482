"""The app of the worker-process tests: the gateway in front of an endpoint that says which
process answered.

Served as ``tests.backends.workerapp:app`` by ``uvicorn --workers N`` or gunicorn with
uvicorn workers, settings from ``OBLETH_*`` variables. Each process writes
``workerapp ready pid=<pid>`` to stderr once its gateway and the app have started (so a
test knows every worker is past the moment the gateway could warn), and answers any HTTP
request, admitted by the gateway, with ``{"pid": ..., "shared_with": [...]}``:
``shared_with`` is the in-process backend's ``shared_with_pids()``, or null on a backend
without it (Redis).
"""

from __future__ import annotations

import json
import os
import sys

from gateway import Gateway, GatewayMiddleware
from gateway.types import Receive, Scope, Send

READY = "workerapp ready pid="


class _WhoAnswers:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        shared_with = getattr(self.gateway.backend, "shared_with_pids", None)
        body = json.dumps(
            {"pid": os.getpid(), "shared_with": None if shared_with is None else shared_with()}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                print(f"{READY}{os.getpid()}", file=sys.stderr, flush=True)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


gateway = Gateway()
app = GatewayMiddleware(_WhoAnswers(gateway), gateway=gateway)
