"""A virtual clock for asyncio: an event loop whose time jumps to the next timer.

The production code a simulation drives (the scheduler's queue timeouts, the counter
backend, the simulated instances' steps) waits with ``loop.call_at``, ``asyncio.sleep``
and futures, and reads ``loop.time()``. On this loop those are the events of a
discrete-event simulation: when nothing is ready to run, the clock moves straight to the
earliest timer instead of sleeping until it. Nothing else changes, so the same code runs
in real time in a server and in virtual time here, and a simulation of minutes takes as
long as its events take to compute.

Runs are deterministic: asyncio runs ready callbacks first in, first out and timers in
order of their time (ties in the order they were scheduled), and this loop does no I/O.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Stalled(RuntimeError):
    """Nothing is scheduled and nothing is ready, yet the simulation has not ended: every
    task waits for something no event will ever bring (a bug in the simulation)."""


class _Advancing(selectors.SelectSelector):
    """Never waits: ``select(timeout)`` moves the loop's clock by ``timeout`` instead.

    The loop registers its self-pipe here, which nothing ever writes to (nothing runs in
    another thread), so there is never an I/O event to report.
    """

    def __init__(self, clock: VirtualClockLoop) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise Stalled("the simulation is stuck: nothing is scheduled and nothing can run")
        if timeout > 0:
            self._clock._now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on virtual time, starting at ``start`` seconds.

    For simulations only: it serves no sockets and must not be used from other threads.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        super().__init__(_Advancing(self))

    def time(self) -> float:
        return self._now


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh virtual-clock loop and close the loop."""
    loop = VirtualClockLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
