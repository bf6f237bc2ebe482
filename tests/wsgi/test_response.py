"""The response iterable ``WSGIGatewayMiddleware`` hands the server: its length where the
app's response has one, and its end when the gateway has gone away under it (closed by
``close()``) or when the server drops it without closing it."""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment
from wsgiref.util import setup_testing_defaults

import httpx
import pytest

from gateway.wsgi import WSGIGatewayMiddleware
from tests.wsgi.heldapp import CHAT, WAIT_S, HeldApp, gated, outcomes, post, wait_until
from tests.wsgi.serving import serving


class ClosingWatch:
    """A WSGI layer between the server and ``app``: it counts the responses the server
    closed and keeps what their ``close()`` raised into the server."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app
        self.closed = 0
        self.raised: list[BaseException] = []

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return _Watched(self.app(environ, start_response), self)


class _Watched:
    def __init__(self, response: Iterable[bytes], watch: ClosingWatch) -> None:
        self.response = response
        self.watch = watch

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.response)

    def close(self) -> None:
        try:
            getattr(self.response, "close", lambda: None)()
        except BaseException as exc:
            self.watch.raised.append(exc)
            raise
        finally:
            self.watch.closed += 1


def environ_of(path: str = CHAT) -> dict[str, Any]:
    """The environ a server would give a GET of ``path``, for a test in the server's role."""
    environ: dict[str, Any] = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    return environ


def ignore_head(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    return None


def streamed(url: str) -> list[str]:
    with httpx.stream("POST", url + CHAT, json={}, trust_env=False, timeout=WAIT_S) as answer:
        return list(answer.iter_lines())


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def test_a_one_chunk_response_keeps_the_content_length_the_server_gives_it() -> None:
    """A server may send a one-item list with its length (wsgiref does): the middleware's
    response has the app's length, and a streamed one still has none."""
    app = HeldApp()
    app.release.set()
    middleware = gated(app)
    with serving(middleware) as url:
        answer = post(url)
    streaming = HeldApp(stream=True)
    streaming.release.set()
    stream_gate = gated(streaming)
    response = stream_gate(environ_of(), ignore_head)
    try:
        chunks = list(response)
    finally:
        getattr(response, "close", lambda: None)()
    middleware.close()
    stream_gate.close()

    assert answer.status_code == 200
    assert answer.headers["content-length"] == str(len(answer.content))
    assert not isinstance(response, Sized)  # len() of a generator is no answer to give
    assert len(chunks) == 2


def test_close_while_a_response_streams_leaves_that_response_nothing_to_give_back(
    pool: ThreadPoolExecutor,
) -> None:
    """Its seat came back when the gateway's loop shut down; the server's later close() of
    the response does nothing, and raises nothing into the server."""
    app = HeldApp(stream=True)
    middleware = gated(app, global_max_in_flight=1)
    watch = ClosingWatch(middleware)
    with serving(watch) as url:
        streaming = pool.submit(streamed, url)
        app.wait_entered(1)
        middleware.close()
        app.release.set()
        lines = streaming.result()
        wait_until(lambda: watch.closed == 1)
        after = post(url)  # a later request starts the gateway again
        wait_until(lambda: watch.closed == 2)
    middleware.close()

    assert watch.raised == []
    assert lines[0] == "first" and len(lines) == 2  # the app streamed on to its end
    assert after.status_code == 200
    assert middleware.gateway.snapshot().inflight == 0
    assert outcomes(middleware) == {"cancelled": 1, "completed": 1}


def test_a_response_dropped_after_close_is_collected_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that drops a response without closing it, after the gateway closed: its
    finalizer has nothing left to give back, and says nothing."""
    app = HeldApp(stream=True)
    app.release.set()
    middleware = gated(app)
    response = middleware(environ_of(), ignore_head)
    first = next(iter(response))
    middleware.close()
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    del response
    gc.collect()

    assert first == b"first\n"
    assert unraisable == []
    assert outcomes(middleware) == {"cancelled": 1}


def test_a_response_read_whole_and_dropped_unclosed_counts_completed() -> None:
    """A server that reads a response to its end and drops it without ``close()`` (PEP
    3333 says it must close): the seat comes back when the response is collected, and the
    request counts ``completed``; it counted ``cancelled``, as if its client had left."""
    app = HeldApp(stream=True)
    app.release.set()
    middleware = gated(app)
    response = middleware(environ_of(), ignore_head)
    chunks = list(response)
    del response
    gc.collect()
    wait_until(lambda: middleware.gateway.snapshot().inflight == 0)

    assert chunks
    assert outcomes(middleware) == {"completed": 1}


def test_a_response_dropped_in_a_reference_cycle_gives_its_seat_back_when_collected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The garbage collector takes the response, not the request's flight on the
    gateway's loop: the seat comes back, counted as cut short, and nothing is logged."""

    class Box:
        response: Iterable[bytes]
        itself: Box

    app = HeldApp(stream=True)
    app.release.set()
    middleware = WSGIGatewayMiddleware(app)
    box = Box()
    box.response = middleware(environ_of(), ignore_head)
    box.itself = box
    first = next(iter(box.response))
    assert middleware.gateway.snapshot().inflight == 1
    del box
    gc.collect()
    wait_until(lambda: middleware.gateway.snapshot().inflight == 0)
    middleware.close()

    assert first == b"first\n"
    assert outcomes(middleware) == {"cancelled": 1}
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []


def test_a_response_read_past_close_ends_cleanly_with_a_token_budget_and_timing() -> None:
    """``close()`` under a response still streaming: the response goes on to its end, and
    what the gateway read of it (its usage, its gaps) is dropped with the loop it was
    for, rather than raised into the server."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        yield b'data: {"usage": null}\n\n'
        yield b'data: {"usage": {"total_tokens": 3}}\n\n'
        yield b"data: [DONE]\n\n"

    middleware = gated(app, tenant_tpm=1000)
    response = middleware(environ_of(), ignore_head)
    chunks = iter(response)
    first = next(chunks)
    middleware.close()
    assert [first, *chunks] == [
        b'data: {"usage": null}\n\n',
        b'data: {"usage": {"total_tokens": 3}}\n\n',
        b"data: [DONE]\n\n",
    ]
    cast(Any, response).close()


class _FailsThenCloses:
    """A response that raises after its first chunk, and whose ``close()`` (a framework's
    teardown) runs until the test lets it end."""

    def __init__(self, closing: threading.Event, closed: threading.Event) -> None:
        self.chunks = 0
        self.closing = closing
        self.closed = closed

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        self.chunks += 1
        if self.chunks == 1:
            return b"first"
        raise RuntimeError("the stream failed")

    def close(self) -> None:
        self.closing.set()
        self.closed.wait(WAIT_S)


def test_a_response_that_raised_mid_stream_holds_its_seat_until_closed(
    pool: ThreadPoolExecutor,
) -> None:
    """The app's ``close()`` after a failure mid-stream still runs on the request's seat:
    the next request waits for it. The seat used to come back when the exception was
    raised, and a waiting request ran beside that ``close()``, over the limit."""
    closing, closed, entered = threading.Event(), threading.Event(), threading.Event()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        if environ["PATH_INFO"] == "/fails":
            return _FailsThenCloses(closing, closed)
        entered.set()
        return [b"ok"]

    middleware = gated(app, global_max_in_flight=1)

    def as_a_server() -> list[bytes]:  # iterate, then close whatever happened
        response = middleware(environ_of("/fails"), ignore_head)
        chunks: list[bytes] = []
        try:
            chunks.extend(response)
        except RuntimeError:
            pass
        finally:
            cast(Any, response).close()
        return chunks

    failing = pool.submit(as_a_server)
    assert closing.wait(WAIT_S)
    waiting = pool.submit(lambda: list(middleware(environ_of("/next"), ignore_head)))
    wait_until(lambda: middleware.gateway.snapshot().queued == 1)
    held = (middleware.gateway.snapshot().inflight, entered.is_set())
    closed.set()
    assert failing.result() == [b"first"]
    assert waiting.result() == [b"ok"]
    wait_until(lambda: middleware.gateway.snapshot().inflight == 0)
    middleware.close()

    assert held == (1, False)
    assert outcomes(middleware) == {"error": 1, "completed": 1}
