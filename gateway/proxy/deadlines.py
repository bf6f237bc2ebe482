"""The waits on an upstream that a proxied exchange bounds in time, each without a timer
per chunk: ``Watchdog``, one clock over the waits of one kind (the upstream taking a chunk
of the body, the response headers to come, the silence between two chunks of the
answer), and ``bounded_writes``, a streamed body whose every chunk the upstream must take
in time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.proxy.inbound import Inbound


class Watchdog:
    """Cancels the task that created it once a wait it was told about has lasted
    ``limit_s``: ``start()`` when such a wait begins (or begins again), ``pause()`` when
    the task stops waiting; time in between waits never counts.

    Any task may call ``start`` and ``pause`` (the body is written by the HTTP client's
    own task, the answer read by the relay's); the cancellation always goes to the creator.
    It costs two assignments per wait, not a timer: the one timer it keeps wakes at most
    once per ``limit_s`` while a wait is counted, and not at all otherwise. It cancels
    at most once; after ``stop()`` it never does, and ``start()`` does nothing.
    """

    __slots__ = (
        "_expired",
        "_handle",
        "_limit_s",
        "_loop",
        "_since",
        "_stopped",
        "_taken_back",
        "_task",
    )

    def __init__(self, limit_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._limit_s = limit_s
        #: when the current wait began, or -1 while there is none
        self._since = -1.0
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False
        self._taken_back = False
        self._stopped = False

    @property
    def limit_s(self) -> float:
        return self._limit_s

    def start(self) -> None:
        """A wait that counts begins now (a wait already counted starts over)."""
        if self._stopped or self._expired:
            return
        self._since = now = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(now + self._limit_s, self._check)

    def pause(self) -> None:
        """The wait is over; nothing counts until the next ``start()``."""
        self._since = -1.0

    def expired(self) -> bool:
        """Whether this cancelled the task, and nothing else did too. The first call
        after it fired takes its cancellation back (``Task.uncancel``), so that the task
        may go on, e.g. to answer; a cancellation from elsewhere (the client gone) wins,
        as ``asyncio.timeout`` lets it: then this says False, and the caller re-raises."""
        if not self._expired:
            return False
        if not self._taken_back:
            self._taken_back = True
            self._task.uncancel()
        return self._task.cancelling() == 0

    def stop(self) -> None:
        """Never cancel the task from now on."""
        self._stopped = True
        self._since = -1.0
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        since = self._since
        if self._stopped or since < 0:
            return  # the next start() sets the timer again
        now = self._loop.time()
        if now - since >= self._limit_s:
            self._expired = True
            self._since = -1.0
            self._task.cancel()
            return
        self._handle = self._loop.call_at(since + self._limit_s, self._check)


async def bounded_writes(
    body: Inbound, writes: Watchdog, *, after_the_last: Watchdog | None = None
) -> AsyncIterator[bytes]:
    """The chunks ``body`` streams, each to be taken by the upstream within
    ``writes.limit_s`` (an upstream that stops reading is stuck, whether or not it has
    started its answer); time spent waiting for the client's next chunk never counts.
    ``after_the_last`` is started once the last chunk was taken: the wait for the answer
    starts there (its owner stops it when the answer came, which makes that a no-op).

    Safe to go on with after the answer has started: an upstream may answer while it
    still reads the body (a transcription streamed as it is uploaded)."""
    async for chunk in body:
        writes.start()
        yield chunk
        writes.pause()
    if after_the_last is not None:
        after_the_last.start()
