"""Lifespan, wrapped and not consumed: the gateway starts before the app's own startup
runs and stops after the app's own shutdown completes; ``AfterShutdown`` calls something
once the app's shutdown is complete."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.gateway import Gateway
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth")

STARTUP_FAILURE = 3
"""The exit status of a process whose app could not start, as uvicorn and gunicorn set it."""


async def run_lifespan(
    gateway: Gateway, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Pass lifespan to ``app``, starting and stopping ``gateway`` around it.

    If the gateway cannot start, the error (which names the setting or plugin at fault) is
    logged on one line and the server is told ``lifespan.startup.failed`` with it, so it
    reports it and does not serve; the app's own startup does not run then. A server that
    answers that message by raising into the app (hypercorn) ends here instead, with
    ``SystemExit(3)``: its own exception would end the process with a traceback of ours
    that buries the line. If the app's startup fails, the gateway is stopped again; an app
    that raises after taking the startup message is reported as the gateway's own
    failure is, so that every server stops (uvicorn's ``--lifespan auto``, hypercorn and
    granian would otherwise take the exception for lifespan unsupported, serve, and
    never stop the gateway the next request starts). An app that does not speak lifespan
    (it raises before taking the startup message, or returns without answering it) is
    answered for: startup completes with the gateway started, and shutdown stops it.
    """
    first = await receive()
    if first["type"] == "lifespan.startup":
        try:
            await gateway.start()
        except Exception as exc:
            log.error("the gateway could not start: %s", exc)
            await _fail_startup(send, str(exc))
            return
    pending: Message | None = first

    async def receive_after_startup() -> Message:
        nonlocal pending
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    answered = False

    async def send_stopping_gateway(message: Message) -> None:
        nonlocal answered
        answered = True
        if message["type"] in (
            "lifespan.startup.failed",
            "lifespan.shutdown.complete",
            "lifespan.shutdown.failed",
        ):
            await gateway.stop()
        await send(message)

    try:
        await app(scope, receive_after_startup, send_stopping_gateway)
    except Exception as exc:
        if answered or first["type"] != "lifespan.startup":
            raise
        if pending is None:  # it took the startup message: its startup failed
            await gateway.stop()
            # the app's own bug, unlike the gateway's errors (which name the setting):
            # its traceback is the clue, as it would be without the gateway
            log.error("the app's startup raised", exc_info=exc)
            await _fail_startup(send, f"the app's startup raised {type(exc).__name__}: {exc}")
            return
        log.debug("the app does not speak lifespan (%r); the gateway answers it alone", exc)
    if not answered and first["type"] == "lifespan.startup":
        await _answer_alone(gateway, receive, send)


async def _answer_alone(gateway: Gateway, receive: Receive, send: Send) -> None:
    """Lifespan for an app that does not speak it (Django's ASGI handler raises on it): the
    gateway, started already, says startup is complete, and stops at shutdown. Otherwise
    the server would take lifespan for unsupported and never tell the gateway to stop."""
    await send({"type": "lifespan.startup.complete"})
    while True:
        message = await receive()
        if message["type"] == "lifespan.shutdown":
            await gateway.stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _fail_startup(send: Send, message: str) -> None:
    """Tell the server that startup failed, saying ``message`` (logged already); if the
    server raises at that (hypercorn's ``LifespanFailureError``), end the process quietly
    with status 3, as uvicorn and gunicorn end one whose app failed to start."""
    try:
        await send({"type": "lifespan.startup.failed", "message": message})
    except Exception:
        task = asyncio.current_task()
        if task is not None:
            # SystemExit leaves the event loop at once, before anyone can ask this task
            # for it; asyncio would then print it as "never retrieved", with a traceback
            task.add_done_callback(_retrieve)
        raise SystemExit(STARTUP_FAILURE) from None


def _retrieve(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()


class AfterShutdown:
    """``app``, with ``then()`` called once its lifespan shutdown is complete: the last
    request has been answered (or cut off) by then. ``obleth serve`` sends the spans still
    batched then."""

    def __init__(self, app: ASGIApp, then: Callable[[], object]) -> None:
        self.app = app
        self.then = then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self.then()

        await self.app(scope, receive, sending)
