"""Lifespan, wrapped and not consumed: the gateway starts before the app's own startup
runs and stops after the app's own shutdown completes."""

from __future__ import annotations

import logging

from gateway.gateway import Gateway
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth")


async def run_lifespan(
    gateway: Gateway, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Pass lifespan to ``app``, starting and stopping ``gateway`` around it.

    If the gateway cannot start, the server is told ``lifespan.startup.failed`` with the
    error (which names the setting or plugin at fault), so it reports it and does not
    serve; the app's own startup does not run then. If the app's startup fails, the
    gateway is stopped again. An app that does not speak lifespan still works: the
    gateway has started by the time the app is called.
    """
    first = await receive()
    if first["type"] == "lifespan.startup":
        try:
            await gateway.start()
        except Exception as exc:
            log.error("the gateway could not start: %s", exc)
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
    pending: Message | None = first

    async def receive_after_startup() -> Message:
        nonlocal pending
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    async def send_stopping_gateway(message: Message) -> None:
        if message["type"] in (
            "lifespan.startup.failed",
            "lifespan.shutdown.complete",
            "lifespan.shutdown.failed",
        ):
            await gateway.stop()
        await send(message)

    await app(scope, receive_after_startup, send_stopping_gateway)
