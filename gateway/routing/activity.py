"""Activity: whether requests flow, as the poller's pace needs to know it."""

from __future__ import annotations

from collections.abc import Callable


def _never() -> bool:
    return False


class Activity:
    """The router marks every request it is asked to route; the poller reads it between rounds.

    - ``arrived()`` is called by the router once per request, routable or not, on the
      event loop. It costs an attribute write and a test, and calls the waker the poller
      left, once.
    - ``seen()`` says whether a request arrived since the last ``seen()``, or one is in
      flight now (``busy()``, given at construction: in cluster mode, on any pod).
    - ``wake_with(waker)`` leaves ``waker`` to be called at the next ``arrived()``, once;
      ``wake_with(None)`` takes it back. The poller leaves one while it polls slowly.
    """

    __slots__ = ("_arrived", "_busy", "_waker")

    def __init__(self, busy: Callable[[], bool] = _never) -> None:
        self._busy = busy
        self._arrived = False
        self._waker: Callable[[], None] | None = None

    def arrived(self) -> None:
        self._arrived = True
        waker = self._waker
        if waker is not None:
            self._waker = None
            waker()

    def seen(self) -> bool:
        arrived, self._arrived = self._arrived, False
        return arrived or self._busy()

    def wake_with(self, waker: Callable[[], None] | None) -> None:
        self._waker = waker
