"""``BodyTimeout``: ASGI middleware that answers 408 when a request body stops arriving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from gateway.asgi.body import TIMED_OUT
from gateway.asgi.responses import send_json_error
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth.server")

_DISCONNECT: Message = {"type": "http.disconnect", TIMED_OUT: True}


class BodyTimeout:
    """Bounds every pause of an HTTP request body to ``timeout_s`` seconds.

    What the app and the client may rely on:

    - Only the time the app spends waiting in ``receive()`` for a body chunk counts, and
      each wait on its own: ``timeout_s`` bounds the longest pause, not the whole upload.
      A request the app is not reading (one waiting for a seat in the fair queue, or whose
      upstream is slow to take the body) is never timed out: the server stops reading
      from such a client, and that is not the client's doing.
    - When a wait runs out, the app's ``receive()`` returns ``http.disconnect``, as if the
      client had left, and keeps returning it: the gateway gives back the request's seat,
      the proxy drops its upstream request. If the app had not started a response when it
      returns, the client gets ``408`` with an OpenAI-style JSON error (code
      ``body_timeout``) and the connection is closed; if it had, the response ends where
      it is and the server closes the connection.
    - Once the body has arrived whole, ``receive()`` is passed through untimed (what it
      waits for then is the client's disconnect). Other scopes pass through untouched.
    """

    def __init__(self, app: ASGIApp, *, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _TimedBody(scope, receive, send, self.timeout_s).run(self.app)


class _TimedBody:
    """One request's body as the app reads it, with its pauses timed."""

    __slots__ = ("_receive", "_scope", "_send", "_timeout_s", "arrived", "started", "timed_out")

    def __init__(self, scope: Scope, receive: Receive, send: Send, timeout_s: float) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._timeout_s = timeout_s
        self.arrived = False
        self.started = False
        self.timed_out = False

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self._scope, self.receive, self.send)
        except Exception:
            await self._answer_if_timed_out()
            raise
        await self._answer_if_timed_out()

    async def receive(self) -> Message:
        if self.timed_out:
            return _DISCONNECT
        if self.arrived:
            return await self._receive()
        try:
            async with asyncio.timeout(self._timeout_s):
                message = await self._receive()
        except TimeoutError:
            self.timed_out = True
            return _DISCONNECT
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.arrived = True
        return message

    def send(self, message: Message) -> Awaitable[None]:
        """The server's ``send``, noting that the response started; a plain function
        handing back the server's awaitable (it runs for every chunk of a stream)."""
        if message["type"] == "http.response.start":
            self.started = True
        return self._send(message)

    async def _answer_if_timed_out(self) -> None:
        if not self.timed_out or self.started:
            return
        self.started = True
        client = self._scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "a client"
        message = (
            f"the request body paused for more than {self._timeout_s:g} s; send it without pausing"
        )
        log.warning(
            "%s: %s %s: %s; answered 408 body_timeout",
            peer,
            self._scope.get("method"),
            self._scope.get("path"),
            message,
        )
        await send_json_error(self._send, 408, message, code="body_timeout", close=True)
