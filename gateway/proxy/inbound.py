"""The client's side of a proxied exchange: its request body as the HTTP client reads it,
its disconnect, and the server's ``send`` as the relay uses it."""

from __future__ import annotations

import asyncio

from gateway.errors import Disconnected
from gateway.types import Message, Receive, Send


class Inbound:
    """The client's side of an exchange: its body for the HTTP client, then its disconnect.

    ``receive`` is read by one party at a time: by ``content()``, then by the HTTP client
    while it sends the rest of a body not held whole, then by ``disconnected()``, which
    waits for the body to be fully relayed before it reads. A disconnect that the body's
    reader gets ends ``disconnected()`` at once: a client that leaves mid-upload is gone
    whether or not the upstream has started its answer.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._held = b""
        #: set once the body was read to its end, or the client left: either way
        #: nobody reads the body any more, and ``disconnected()`` may read or return
        self._body_done = asyncio.Event()
        self._gone = False

    async def content(self, *, hold_up_to: int) -> bytes | Inbound | None:
        """The request body as the HTTP client should send it: None when there is none,
        bytes when it was read whole, else this object, an async iterator of its chunks.

        Body messages are read until the body ends (bytes) or more than ``hold_up_to``
        bytes have come in (the iterator, starting with those). With 0, a body that comes
        in one message is read whole, any other is streamed from its first message on.
        Raises ``Disconnected`` if the client leaves before its body was read that far.
        """
        held: list[bytes] = []
        size = 0
        while True:
            message = await self._next()
            body: bytes = message.get("body", b"")
            held.append(body)
            size += len(body)
            if not message.get("more_body", False):
                self._body_done.set()
                return b"".join(held) or None
            if size > hold_up_to:
                self._held = b"".join(held)
                return self

    def __aiter__(self) -> Inbound:
        return self

    async def __anext__(self) -> bytes:
        held, self._held = self._held, b""
        if held:
            return held
        while not self._body_done.is_set():
            message = await self._next()
            if not message.get("more_body", False):
                self._body_done.set()
            chunk: bytes = message.get("body", b"")
            if chunk:
                return chunk
        raise StopAsyncIteration

    async def disconnected(self) -> None:
        """Returns once the client has gone away (or, on uvicorn, once the response is
        complete, which then makes no difference). While the body is still being sent
        upstream, its reader is the one that sees the disconnect, and this returns then."""
        await self._body_done.wait()
        if self._gone:
            return
        while (await self._receive())["type"] != "http.disconnect":
            pass

    async def _next(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._gone = True
            self._body_done.set()
            raise Disconnected()
        return message


class ClientSend:
    """The server's ``send``, raising ``Disconnected`` where the server raises ``OSError``.

    The ASGI spec lets a server raise an ``OSError`` subclass when ``send`` is called after
    the client left (uvicorn drops the message instead); either way the exchange just ends.
    ``gone`` is set once the client is known to have left.
    """

    __slots__ = ("_send", "gone")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.gone = False

    async def __call__(self, message: Message) -> None:
        try:
            await self._send(message)
        except OSError as exc:
            raise Disconnected() from exc
