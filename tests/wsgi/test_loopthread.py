"""The WSGI gateway's event loop thread when something escapes its loop: asyncio lets
``SystemExit`` out of a task (a plugin's stray ``sys.exit()`` on a path the gateway does
not shield), and the loop, with the gateway's state, is gone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from gateway.settings import Settings
from gateway.wsgi.loopthread import LoopThread
from gateway.wsgi.middleware import WSGIGatewayMiddleware


def test_a_loop_that_dies_fails_its_requests_and_the_later_ones_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the request whose task escaped waited for good, and so did the worker
    threads of later requests. Now each gets a ``RuntimeError`` that says what stopped
    the loop, and the log has the traceback."""
    thread = LoopThread("test-loop")
    started = threading.Event()

    async def waiting() -> None:
        started.set()
        await asyncio.sleep(60)

    async def exiting() -> None:
        raise SystemExit(4)

    pending = thread.submit(waiting())
    assert started.wait(5)
    with caplog.at_level(logging.CRITICAL, logger="obleth"):
        escaped = thread.submit(exiting())
        done, _ = concurrent.futures.wait([escaped, pending], 5)
    assert done == {escaped, pending}
    assert pending.cancelled() or isinstance(pending.exception(), RuntimeError)
    with pytest.raises(RuntimeError, match=r"stopped on SystemExit\(4\).*restart the process"):
        thread.loop()

    [record] = caplog.records
    assert "the gateway's event loop in process" in record.getMessage()
    assert record.exc_info is not None


def test_a_task_that_exits_as_it_is_ended_does_not_keep_its_request_waiting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ending the requests still on a dead loop cancels their tasks; one that runs
    ``sys.exit()`` as it is cancelled used to escape that cleanup, leaving its request
    waiting for good and the loop unclosed. Both are ended now, and the log says so."""
    thread = LoopThread("test-loop")
    started = threading.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise SystemExit(5) from None

    async def exiting() -> None:
        raise SystemExit(4)

    pending = thread.submit(stubborn())
    assert started.wait(5)
    loop = thread.loop()
    with caplog.at_level(logging.CRITICAL, logger="obleth"):
        escaped = thread.submit(exiting())
        done, _ = concurrent.futures.wait([escaped, pending], 5)
    assert done == {escaped, pending}
    # its own SystemExit, or the RuntimeError saying the loop stopped: either way, told
    assert isinstance(pending.exception(), RuntimeError | SystemExit)
    assert thread._thread is not None
    thread._thread.join(5)
    assert loop.is_closed()
    with pytest.raises(RuntimeError, match=r"stopped on SystemExit\(4\)"):
        thread.loop()
    assert [r.exc_info is not None for r in caplog.records] == [True, True]
    assert "while ending its requests" in caplog.records[1].getMessage()


def test_a_request_handed_to_a_new_loop_while_the_old_one_closes_is_served() -> None:
    """``close()`` runs its last coroutine on the old loop; a request handed over
    meanwhile starts a new loop. The old loop's end failed every request the thread
    object knew of, the new loop's included."""
    thread = LoopThread("test-loop")
    in_last, release, closed = threading.Event(), threading.Event(), threading.Event()

    async def work() -> str:
        await asyncio.sleep(0)
        return "ok"

    async def slow_work() -> str:  # still running when the old loop has ended
        for _ in range(500):
            if closed.is_set():
                return "ok"
            await asyncio.sleep(0.01)
        return "never told the old loop ended"

    async def last() -> None:
        in_last.set()
        for _ in range(500):
            if release.is_set():
                return
            await asyncio.sleep(0.01)

    assert thread.submit(work()).result(5) == "ok"
    closer = threading.Thread(target=thread.close, args=(last,), daemon=True)
    closer.start()
    assert in_last.wait(5)
    handed = thread.submit(slow_work())  # the old loop is closing: a new one starts
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    closed.set()
    assert handed.result(5) == "ok"
    thread.close()


def test_a_request_handed_over_as_the_loop_dies_is_answered_503() -> None:
    """A worker thread whose request was still queued for the loop when it died waited
    on its verdict for good; it is answered now: served by the loop's last round, or told
    the gateway stopped, as when it stops under a request."""

    def app(environ: dict[str, object], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        return [b"ok"]

    middleware = WSGIGatewayMiddleware(app, Settings(global_max_in_flight=4))
    middleware.start()
    busy, queued = threading.Event(), threading.Event()

    async def exiting() -> None:
        busy.set()
        queued.wait(5)  # the loop is held here while the worker hands its request over
        raise SystemExit(4)

    loop = middleware._loop
    loop.submit(exiting())
    assert busy.wait(5)
    submit = loop.submit

    def handing_over(coroutine: Any) -> concurrent.futures.Future[Any]:
        future = submit(coroutine)
        queued.set()
        return future

    loop.submit = handing_over  # type: ignore[method-assign]
    answered: dict[str, Any] = {}

    def worker() -> None:
        environ: dict[str, Any] = {"PATH_INFO": "/v1/completions"}
        setup_testing_defaults(environ)
        answered["body"] = b"".join(
            middleware(
                environ, lambda status, headers, exc=None: answered.setdefault("status", status)
            )
        )

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    # the loop's last round may still have admitted it; if not, the gateway stopped
    assert answered["status"] == "200 OK" or b'"code": "unavailable"' in answered["body"]
