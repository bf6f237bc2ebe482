"""Lifespan, wrapped and not consumed: the gateway starts before the app's own startup
runs and stops after the app's own shutdown completes."""

from __future__ import annotations

from gateway.gateway import Gateway
from gateway.types import ASGIApp, Message, Receive, Scope, Send


async def run_lifespan(
    gateway: Gateway, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Pass lifespan to ``app``, starting and stopping ``gateway`` around it.

    If the gateway cannot start, the error reaches the app's lifespan handler as if its
    own startup had failed, so the server reports it and does not serve. An app that does
    not speak lifespan still works: the gateway then starts on the first request.
    """

    async def receive_starting_gateway() -> Message:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await gateway.start()
        return message

    async def send_stopping_gateway(message: Message) -> None:
        if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            await gateway.stop()
        await send(message)

    await app(scope, receive_starting_gateway, send_stopping_gateway)
