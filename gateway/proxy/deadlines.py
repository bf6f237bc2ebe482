"""The waits on an upstream that a proxied exchange bounds in time, each without a timer
per chunk: the body it must take (``bounded_writes``) and the silence between two chunks
of its answer (``Silence``). The response timeout itself starts where the body ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.proxy.inbound import Inbound


async def bounded_writes(
    body: Inbound, deadline: asyncio.Timeout, timeout_s: float
) -> AsyncIterator[bytes]:
    """The body ``body`` streams, each chunk to be taken by the upstream within
    ``timeout_s`` (an upstream that stops reading is not going to answer either); the
    wait for the answer starts after the last chunk. Time spent waiting for the client's
    next chunk never counts."""
    loop = asyncio.get_running_loop()
    async for chunk in body:
        deadline.reschedule(loop.time() + timeout_s)
        yield chunk
        deadline.reschedule(None)
    deadline.reschedule(loop.time() + timeout_s)


class Silence:
    """Cancels the task relaying a response once the upstream has sent nothing for
    ``limit_s`` while the task waits for it (``reading``); time spent sending to the
    client never counts. Costs a flag per chunk, not a timer: the timer it keeps wakes at
    most once per ``limit_s`` and checks when the upstream last sent something."""

    __slots__ = ("_expired", "_handle", "_limit_s", "_loop", "_since", "_task")

    def __init__(self, limit_s: float) -> None:
        self._loop = loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._limit_s = limit_s
        self._since = loop.time()
        self._expired = False
        self._handle = loop.call_at(self._since + limit_s, self._check)

    @property
    def reading(self) -> bool:
        return self._since >= 0

    @reading.setter
    def reading(self, now: bool) -> None:
        # the time the current wait began, or -1 while the task is not waiting for data
        self._since = self._loop.time() if now else -1.0

    def expired(self) -> bool:
        """Whether this cancelled the task (and, if so, takes that cancellation back)."""
        if self._expired:
            self._task.uncancel()
        return self._expired

    def stop(self) -> None:
        self._handle.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        since = self._since
        if since >= 0 and now - since >= self._limit_s:
            self._expired = True
            self._task.cancel()
            return
        start = since if since >= 0 else now
        self._handle = self._loop.call_at(start + self._limit_s, self._check)
