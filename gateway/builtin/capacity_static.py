"""The ``static`` capacity provider: ``global_max_in_flight``, tunable at run time."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.settings import Settings


class StaticCapacity:
    """A fixed limit that an operator may change while the gateway runs.

    ``set_max_in_flight`` takes effect for the next admission decision; a raise admits
    waiters at once (subscribers are told), a cut never revokes running requests. ``0``
    pauses admissions (for maintenance): running requests finish, newcomers wait (or are
    refused, as the overflow policy says) until the limit is raised again.
    """

    def __init__(self, settings: Settings) -> None:
        self._limit = settings.global_max_in_flight
        self._subscribers: list[Callable[[], None]] = []

    def max_in_flight(self) -> int:
        return self._limit

    def set_max_in_flight(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"max_in_flight={limit!r}: expected a whole number of at least 0 (0 pauses)"
            )
        self._limit = limit
        for callback in self._subscribers:
            callback()

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)


@hookimpl(trylast=True)
def obleth_capacity_providers() -> Mapping[str, Factory]:
    return {"static": StaticCapacity}
