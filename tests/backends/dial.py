"""Computed capacity providers whose value a test sets, and the plugin that offers one
under the name ``dial``: for tests of computed limits in process and in cluster mode."""

from __future__ import annotations

from collections.abc import Callable

from gateway import hookimpl


class Dial:
    """A computed capacity provider whose value the test sets, announced like the
    ``kv-pressure`` provider's; it keeps the ceiling the gateway hands it."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.ceiling: Callable[[], int] = lambda: -1
        self._subscribers: list[Callable[[], None]] = []

    def max_in_flight(self) -> int:
        return self.value

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)

    def use_ceiling(self, ceiling: Callable[[], int]) -> None:
        self.ceiling = ceiling

    def turn(self, value: int) -> None:
        self.value = value
        for callback in self._subscribers:
            callback()


class Gauge(Dial):
    """The same, read on every decision: it announces nothing."""

    subscribe = None  # type: ignore[assignment]


class DialPlugin:
    def __init__(self, dial: Dial) -> None:
        self.dial = dial

    @hookimpl
    def obleth_capacity_providers(self) -> dict[str, object]:
        return {"dial": lambda settings: self.dial}
