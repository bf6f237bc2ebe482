"""The ``fraction`` capacity provider: a fixed share of ``global_max_in_flight``.

Obleth imports this module through the entry point in ``pyproject.toml`` and registers
every function marked ``@hookimpl`` in it. A plugin module holds hooks and whatever
classes they hand out; it does no work at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway import Settings, hookimpl


class FractionCapacity:
    """Admits ``FRACTION`` of ``global_max_in_flight`` requests at once, at least one.

    Useful when a gateway shares its backend with another consumer that needs the rest.
    The value is worked out once, from the settings; ``max_in_flight`` is called on every
    admission decision, so it only reads an attribute.
    """

    FRACTION = 0.5

    def __init__(self, settings: Settings) -> None:
        self._limit = max(1, int(settings.global_max_in_flight * self.FRACTION))

    def max_in_flight(self) -> int:
        return self._limit


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    """Offer ``fraction``; Obleth calls the factory only if the user selects that name."""
    return {"fraction": FractionCapacity}
