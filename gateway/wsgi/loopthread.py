"""``LoopThread``: the event loop a WSGI app's gateway runs on, in a thread of its own.

The gateway's core is asynchronous: the scheduler's queue, Redis calls, heartbeats, the
upstream poller. Under a WSGI server the requests arrive on the server's worker threads
instead, so the gateway gets one event loop of its own per process, and the worker
threads hand it their requests (``submit``).

The loop starts at its first use in each process, not when the app is built: a server
that imports the app before it forks its workers (gunicorn ``--preload``) gives each
worker a loop of its own, as a thread does not survive ``fork()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from gateway.tasks import cancel_and_wait

log = logging.getLogger("obleth")

T = TypeVar("T")

#: How long ``close()`` waits for the gateway to stop (its leases given back in Redis).
STOP_S = 5.0


class LoopThread:
    """An asyncio event loop on a daemon thread, one per process, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        #: the process the loop runs in: after a fork, the child starts one of its own
        self._pid = 0
        #: what ``submit`` runs until it ends: an asyncio task waiting on a future is held
        #: only by that future, and a request's future (its passage) is held by its
        #: response, so a response dropped in a reference cycle would take its task into
        #: the garbage (destroyed pending, its ``finally`` run by the collector's thread)
        self._running: set[concurrent.futures.Future[Any]] = set()
        #: what ended the loop when something escaped it (a plugin's ``sys.exit()`` in a
        #: task, say); None while it runs, or after a ``close()``
        self._died: BaseException | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started if it is not yet; ``RuntimeError``
        once it died (see ``_run``)."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            if self._died is not None:
                raise _dead(self._died)
            return loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._start()
            assert self._loop is not None
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; its outcome arrives in the returned future. The
        task running it is kept alive until it ends, whoever holds the future."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop())
        # the future holds its task (it cancels the task when cancelled itself)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        return future

    def close(self, last: Callable[[], Awaitable[object]] | None = None) -> None:
        """Run ``last`` on the loop (waiting up to ``STOP_S``), then stop the loop and its
        thread. Nothing happens when the loop never started in this process; a later
        ``loop()`` starts a new one."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._pid != os.getpid():
                return
            if self._died is not None:  # nothing left to run ``last`` on
                return
            self._loop = self._thread = None
        if last is not None:

            async def finish() -> None:
                await last()

            try:
                asyncio.run_coroutine_threadsafe(finish(), loop).result(STOP_S)
            except Exception as exc:
                log.error("the gateway did not stop cleanly: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_S)

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        running = threading.Event()
        # each loop its own: a loop's end fails only the requests it was running
        self._running = set()
        thread = threading.Thread(
            target=self._run, args=(loop, running, self._running), name=self._name, daemon=True
        )
        self._died = None
        thread.start()
        running.wait()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()

    def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        running: threading.Event,
        futures: set[concurrent.futures.Future[Any]],
    ) -> None:
        """The loop's thread. Should an exception escape the loop (asyncio lets
        ``SystemExit`` and ``KeyboardInterrupt`` out of a task), the log says so, the
        requests waiting on it are answered, and later ones get a ``RuntimeError`` at once
        instead of waiting for good: the gateway's state went with the loop, and only a
        new process starts afresh."""
        asyncio.set_event_loop(loop)
        loop.call_soon(running.set)
        died: BaseException | None = None
        try:
            loop.run_forever()
        except BaseException as exc:
            died = self._died = exc
            log.critical(
                "the gateway's event loop in process %d stopped on %r; requests through "
                "the gateway fail until the process is restarted",
                os.getpid(),
                exc,
                exc_info=exc,
            )
        finally:
            escaped = _end_tasks(loop)
            if escaped is not None:  # a task that exits even as it is cancelled
                log.critical(
                    "the gateway's event loop in process %d stopped on %r while ending its "
                    "requests",
                    os.getpid(),
                    escaped,
                    exc_info=escaped,
                )
                if died is None and self._loop is loop:
                    died = self._died = escaped
            loop.close()
            cause = died or escaped
            if cause is not None:
                # a request whose task did not end hears why, rather than waiting for good
                for future in list(futures):
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        future.set_exception(_dead(cause))


def call_soon_unless_closed(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> None:
    """``callback(*args)`` on ``loop``, from any thread; nothing once the loop has closed
    (``close()``, or the process exiting, under a response still streaming)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _end_tasks(loop: asyncio.AbstractEventLoop) -> BaseException | None:
    """Ends the requests still on ``loop``, so that their worker threads are answered: a
    few rounds, as ending one may start another, or a hand-over queued meanwhile. What
    escaped a round (a task's ``sys.exit()`` as it is cancelled) is returned, the first
    one, after every round has run: the other tasks still end."""
    escaped: BaseException | None = None
    for _ in range(3):
        try:
            # hand-overs queued from other threads meanwhile become tasks first
            loop.run_until_complete(asyncio.sleep(0))
            pending = asyncio.all_tasks(loop)
            if not pending:
                break
            stopping = (cancel_and_wait(task) for task in pending)
            loop.run_until_complete(asyncio.gather(*stopping, return_exceptions=True))
        except BaseException as exc:
            escaped = escaped or exc
    return escaped


def _dead(cause: BaseException) -> RuntimeError:
    return RuntimeError(
        f"the gateway's event loop in this process stopped on {cause!r} (the log has its "
        "traceback, naming the code it came from); restart the process"
    )
