"""A process that serves, as ``obleth serve`` does, through ``gateway.server.running``: an
app that answers ``/`` at once and streams ``/stream`` for ever, with a graceful shutdown
of half a second, on each port it is given (one server per port, as the gateway and the
admin API are). Run by ``test_serve_signals.py`` as ``python signalled.py PORT...``."""

from __future__ import annotations

import asyncio
import sys

import uvicorn

from gateway.server.running import Server, serve
from gateway.types import Receive, Scope, Send


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if scope["path"] != "/stream":
        await send({"type": "http.response.body", "body": b"ready"})
        return
    while True:
        await send({"type": "http.response.body", "body": b"token\n", "more_body": True})
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    options = {"host": "127.0.0.1", "lifespan": "off", "timeout_graceful_shutdown": 0.5}
    serve([Server(uvicorn.Config(app, port=int(port), **options)) for port in sys.argv[1:]])
