"""The request body, read once with a size bound and replayed to the app unchanged.

While a request waits for a seat, the same object watches for the client going away:
whatever it receives meanwhile is kept and replayed too, so the app sees exactly the
messages the server sent.
"""

from __future__ import annotations

import sys
from collections import deque

from gateway.errors import BadRequest, Disconnected
from gateway.types import Message, Receive, Scope

#: How much of a body still arriving the disconnect watch of a waiting request takes off
#: the connection, at most (about what uvicorn buffers before it stops reading): held for
#: every waiter, the whole body would cost up to ``max_queue`` times ``max_body_bytes``.
WATCH_BYTES = 64 * 1024


#: A key of the ``http.disconnect`` message ``BodyTimeout`` gives the app when a body
#: paused too long: the client is there, too slow, and is answered 408.
TIMED_OUT = "obleth.body_timed_out"


class BodyTooLarge(BadRequest):
    def __init__(self, limit: int, *, declared: bool = False) -> None:
        """``declared``: the ``Content-Length`` said so, and nothing was read; the answer
        closes the connection rather than leave the server to take in a body it will
        throw away."""
        super().__init__(
            f"the request body is larger than the gateway reads ({limit} bytes); "
            "send a smaller body, or raise max_body_bytes",
            status=413,
            close=declared,
        )


class RequestBody:
    """Wraps an ASGI ``receive``: ``read()`` buffers, ``replay`` is the app's ``receive``."""

    __slots__ = (
        "_buffered",
        "_complete",
        "_declared",
        "_limit",
        "_receive",
        "_seen_bytes",
        "disconnected",
    )

    def __init__(self, receive: Receive, limit: int, declared: int | None = None) -> None:
        """``declared``: the ``Content-Length`` of the request (``declared_length``), if
        any; over ``limit``, ``read()`` refuses the body before taking any of it (and so
        before the server answers an ``Expect: 100-continue``)."""
        self._receive = receive
        self._limit = limit
        self._declared = declared
        self._buffered: deque[Message] = deque()
        self._complete = False
        self._seen_bytes = 0
        self.disconnected = False

    async def read(self) -> bytes:
        """The whole body; raises ``BodyTooLarge`` past the bound, ``Disconnected`` if the
        client leaves first."""
        if self._declared is not None and self._declared > self._limit and not self._seen_bytes:
            raise BodyTooLarge(self._limit, declared=True)
        chunks = []
        while not self._complete:
            message = await self._take()
            if message["type"] == "http.disconnect":
                raise Disconnected(timed_out=bool(message.get(TIMED_OUT)))
            if self._seen_bytes > self._limit:
                raise BodyTooLarge(self._limit)
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
        self._buffered.clear()
        self._buffered.append({"type": "http.request", "body": body, "more_body": False})
        return body

    @property
    def complete(self) -> bool:
        """Whether the whole body has been received (and is kept for the app)."""
        return self._complete

    async def watch_disconnect(self) -> bool:
        """Returns True once the client is gone; False when it stops telling: a body
        still arriving past ``WATCH_BYTES`` (or the bound, if lower) is left on the
        connection for the app to read, and the app finds a client that left when it
        does. A body received whole is watched past it, however large."""
        budget = min(self._limit, WATCH_BYTES)
        while True:
            if self._seen_bytes > budget and not self._complete:
                return False
            message = await self._take()
            if message["type"] == "http.disconnect":
                return True

    async def replay(self) -> Message:
        if self._buffered:
            return self._buffered.popleft()
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    async def _take(self) -> Message:
        message = await self._receive()
        self._buffered.append(message)
        kind = message["type"]
        if kind == "http.disconnect":
            self.disconnected = True
        elif kind == "http.request":
            self._seen_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                self._complete = True
        return message


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``; None without one (a chunked body) or when it is
    no number (the server refuses such requests before the app sees them)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def expects_continue(scope: Scope) -> bool:
    """Whether the client sent ``Expect: 100-continue`` (it sends its body only to a server
    that will take it)."""
    for name, value in scope["headers"]:
        if name == b"expect":
            return bool(value.strip().lower() == b"100-continue")
    return False


def has_json_body(scope: Scope, limit: int) -> bool:
    """JSON bodies are read for classifiers and the router; anything else streams to the
    app. JSON is what FastAPI, and so vLLM, parses as JSON: ``application/json``,
    ``application/<anything>+json``, and a body with no ``Content-Type`` at all (what
    ``requests.post(url, data=json.dumps(...))`` sends). Without a ``Content-Type`` the
    body may be anything (a file posted raw), so it is read only when its
    ``Content-Length`` is within ``limit``: a larger one streams to the app, where a
    declared JSON type gets ``413``."""
    if scope["method"] not in _BODY_METHODS:
        return False
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return bool(
                media == b"application/json"
                or (media.startswith(b"application/") and media.endswith(b"+json"))
            )
    length = declared_length(scope)
    return length is not None and length <= limit


def reads_body(scope: Scope, limit: int, *, routed: bool, priced: bool) -> bool:
    """Whether the gateway reads the request's body before admission. ``routed``: a
    classifier or the router reads JSON bodies (``has_json_body``; a declared JSON body
    over ``limit`` is then refused 413). ``priced``: a token budget estimates it, from a
    JSON body, or one with neither ``Content-Type`` nor ``Content-Length`` (sent chunked:
    a server may parse it as JSON all the same), up to ``limit``; a body declared longer
    is not read for that alone, its length prices it."""
    if has_json_body(scope, limit) and routed:
        return True
    if not priced or scope["method"] not in _BODY_METHODS:
        return False
    length = declared_length(scope)
    if length is not None:
        return length <= limit and has_json_body(scope, limit)
    return has_json_body(scope, limit) or not any(
        name == b"content-type" for name, _ in scope["headers"]
    )


def client_left(error: Exception, body: RequestBody | None) -> bool:
    """Whether an app raised ``error`` because its client went away: the flight watched
    ``body`` and saw the disconnect, or the error is Starlette's ``ClientDisconnect``
    (what ``Request.body()`` raises then; an app that raised it has Starlette loaded,
    so an app without Starlette costs no import of it)."""
    if body is not None and body.disconnected:
        return True
    requests = sys.modules.get("starlette.requests")
    return requests is not None and isinstance(error, requests.ClientDisconnect)
