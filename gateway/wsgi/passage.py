"""``Passage``: one WSGI request handed between its worker thread and the gateway's loop.

The request goes through the same ``Flight`` as an ASGI request (classification,
admission, routing, the tallies, the spans, the release of its seats), on the gateway's
loop. Its "app" there is ``hand_over``: called once the request is admitted, it tells the
worker thread to run the WSGI app, and returns when the thread says the response is over
(its iterable closed). The flight's ``finally`` then gives the seats back, exactly once.
A request the gateway answers itself (503, 429, 400, 413) comes back to the thread as a
complete ``Answer`` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import logging
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any, cast
from wsgiref.types import StartResponse
from wsgiref.util import is_hop_by_hop

from gateway.asgi.flight import Flight
from gateway.asgi.plan import FlightPlan
from gateway.types import Message, Scope
from gateway.wsgi.loopthread import call_soon_unless_closed
from gateway.wsgi.watch import ResponseWatch

log = logging.getLogger("obleth")

#: where a flight's ``hand_over`` finds its passage in the scope
PASSAGE = "obleth.wsgi.passage"


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete response the gateway gave itself."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def write(self, start_response: StartResponse) -> list[bytes]:
        try:
            phrase = http.HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        # hop-by-hop headers (the ASGI answer's ``Connection: close``) are the WSGI
        # server's to write: PEP 3333 forbids them to the app
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in self.headers
            if not is_hop_by_hop(name.decode("latin-1"))
        ]
        start_response(f"{self.status} {phrase}", headers)
        return [self.body]


#: a flight that ended without an answer nor an admission: the gateway stopped under it
STOPPED = Answer(
    503,
    [(b"content-type", b"application/json"), (b"retry-after", b"1")],
    b'{"error": {"message": "the gateway stopped while the request waited", '
    b'"type": "server_overloaded", "param": null, "code": "unavailable"}}',
)


#: the answer to a request whose body ended before its ``Content-Length``, read ahead: the
#: client left, or stopped sending (it may still read), and its request never ran
CUT_SHORT = Answer(
    400,
    [(b"content-type", b"application/json")],
    b'{"error": {"message": "the request body ended before the length its Content-Length '
    b'announced; the request was not run", "type": "invalid_request_error", "param": null, '
    b'"code": null}}',
)


class AppFailed(Exception):
    """The WSGI app raised (its worker thread re-raises the original to the server)."""


class Passage:
    """The meeting point of one request's worker thread and its flight on the loop.

    ``verdict`` resolves once: to None when the request is admitted (the thread runs the
    app, and must call ``finish`` exactly once afterwards), or to the ``Answer`` to send.
    """

    __slots__ = ("_done", "_flight", "_head", "_loop", "_parts", "verdict")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.verdict: concurrent.futures.Future[Answer | None] = concurrent.futures.Future()
        self._done: asyncio.Future[None] | None = None
        self._head: Message | None = None
        self._parts: list[bytes] = []
        self._flight: Flight | None = None

    def settle_usage(self) -> Callable[[int], None] | None:
        """For an admitted request whose tenant has a token budget: what settles it at the
        tokens its response reports (``Flight.settle_budget``, to call on the loop); else
        None."""
        flight = self._flight
        if flight is None or not flight.plan.settles_usage(flight.ticket.tenant, flight.reserved):
            return None
        return flight.settle_budget

    async def fly(self, plan: FlightPlan, scope: Scope, ahead: list[Message] | None) -> None:
        """The request's flight, on the loop. ``ahead``: the messages of the body read
        ahead of it (``body_ahead``), None when the body stays for the app."""
        scope[PASSAGE] = self
        left = False

        async def receive() -> Message:
            nonlocal left
            if ahead:
                message = ahead.pop(0)
                left = message["type"] == "http.disconnect"
                return message
            # WSGI does not tell when a client leaves: past what was read ahead, to the
            # flight, it never does
            await asyncio.get_running_loop().create_future()
            raise AssertionError("unreachable")

        try:
            flight = self._flight = Flight(plan, scope, receive, self._collect)
            await flight.run()
        except (AppFailed, asyncio.CancelledError):
            pass  # the worker thread knows
        except BaseException as exc:
            if not self.verdict.done():
                self.verdict.set_exception(exc)
            else:
                log.exception("the gateway failed after the app ran")
        finally:
            if not self.verdict.done():
                self.verdict.set_result(CUT_SHORT if left else STOPPED)

    def unflown(self, flight: concurrent.futures.Future[None]) -> None:
        """The done callback of the future ``fly()`` was submitted under: a flight that
        never ran (its loop died with it still queued, see ``LoopThread``) left the
        verdict unset, and the worker thread would wait on it for good; it is told the
        gateway stopped, as a flight cut short by the loop's end is."""
        if not self.verdict.done() and (flight.cancelled() or flight.exception() is not None):
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.verdict.set_result(STOPPED)

    async def _collect(self, message: Message) -> None:
        """The flight's ``send``, for an answer the gateway gives itself."""
        if message["type"] == "http.response.start":
            self._head = message
            return
        self._parts.append(message.get("body", b""))
        if not message.get("more_body", False) and self._head is not None:
            answer = Answer(
                self._head["status"], list(self._head.get("headers", ())), b"".join(self._parts)
            )
            self.verdict.set_result(answer)

    async def hand_over(self) -> None:
        """The flight's app: tell the worker thread to run the WSGI app, and wait until it
        calls ``finish``."""
        done = self._done = self._loop.create_future()
        self.verdict.set_result(None)
        await done

    def finish(self, how: str, error: BaseException | None = None) -> None:
        """From the worker thread, once: the response is over. ``how`` is ``"completed"``
        (its iterable ran to the end and was closed), ``"cut"`` (closed early: the client
        left or the server gave up) or ``"failed"`` (the app raised ``error``).

        Does nothing once the loop has shut down (``close()``, or the process exiting)
        under the response: its flight was cancelled then, and its seats given back."""
        call_soon_unless_closed(self._loop, _settle, self._done, how, error)


def _settle(done: asyncio.Future[None] | None, how: str, error: BaseException | None) -> None:
    if done is None or done.done():
        return
    if how == "completed":
        done.set_result(None)
    elif how == "cut":
        done.cancel()
    else:
        failure = AppFailed(repr(error))
        done.set_exception(failure)


async def run_app(scope: Scope, receive: Any, send: Any) -> None:
    """The ASGI app of every WSGI flight: the passage of its request takes over."""
    passage: Passage = scope[PASSAGE]
    await passage.hand_over()


def hold(inner: Iterable[bytes], passage: Passage, watch: ResponseWatch | None) -> Held:
    """The app's response ``inner``, held by the request's seats: a ``SizedHeld`` when
    ``inner`` has a length (PEP 3333 lets a server read it, and wsgiref sends a
    one-chunk list with its ``Content-Length``), else a ``Held``, which has none."""
    if isinstance(inner, Sized):
        return SizedHeld(inner, passage, watch)
    return Held(inner, passage, watch)


class Held:
    """The WSGI app's response iterable, holding the request's seats until the server
    closes it (PEP 3333 says it must); a response dropped unclosed gives them back when
    it is collected. A response that raised mid-stream holds them until then too: the
    app's ``close()`` (a framework's teardown, an upstream stream being closed) still
    runs on the request's seat. It has no length: ``SizedHeld`` wraps a response that
    has one."""

    __slots__ = (
        "__weakref__",
        "_ended",
        "_failure",
        "_inner",
        "_iterator",
        "_passage",
        "_watch",
    )

    def __init__(
        self, inner: Iterable[bytes], passage: Passage, watch: ResponseWatch | None = None
    ) -> None:
        self._inner = inner
        self._iterator: Iterator[bytes] | None = None
        self._passage: Passage | None = passage
        self._ended = False
        #: what the app raised while iterated, reported when the server closes the response
        self._failure: BaseException | None = None
        #: reads the first byte's time and the usage, when the gateway follows either
        self._watch = watch

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            if self._iterator is None:
                # a lazy body fails here as well as in next(): both are the app's error
                self._iterator = iter(self._inner)
            chunk = next(self._iterator)
        except StopIteration:
            self._ended = True
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.ended()
            raise
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            raise
        if self._watch is not None:
            self._watch.chunk(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        except BaseException as exc:
            self._end("failed", exc)
            raise
        self._end_as_iterated()

    def _end_as_iterated(self) -> None:
        failure, self._failure = self._failure, None  # no cycle through its traceback
        if failure is not None:
            self._end("failed", failure)
        else:
            self._end("completed" if self._ended else "cut")

    def _end(self, how: str, error: BaseException | None = None) -> None:
        passage, self._passage = self._passage, None
        if passage is not None:
            passage.finish(how, error)

    def __del__(self) -> None:
        # a server that dropped the response unclosed: complete when it read it to its
        # end, failed when the app raised, cut otherwise
        self._end_as_iterated()


class SizedHeld(Held):
    """A ``Held`` response whose app's iterable has a length, which it answers."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(cast(Sized, self._inner))
