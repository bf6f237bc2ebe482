"""Offers a capacity provider under a misspelled hook name (``provider`` for
``providers``): pluggy alone would file it under a hook nobody calls, and ``fixed`` would
silently never exist."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway import Settings, hookimpl


class FixedCapacity:
    def __init__(self, settings: Settings) -> None:
        self._limit = 8

    def max_in_flight(self) -> int:
        return self._limit


@hookimpl
def obleth_capacity_provider() -> Mapping[str, Callable[[Settings], object]]:
    return {"fixed": FixedCapacity}
