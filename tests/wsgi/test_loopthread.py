"""The WSGI gateway's event loop thread when something escapes its loop: asyncio lets
``SystemExit`` out of a task (a plugin's stray ``sys.exit()`` on a path the gateway does
not shield), and the loop, with the gateway's state, is gone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

import pytest

from gateway.wsgi.loopthread import LoopThread


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
