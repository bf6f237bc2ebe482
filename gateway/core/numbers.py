"""What counts as a usable number in settings: the one test every check shares."""

from __future__ import annotations

import math


def finite(value: object) -> bool:
    """Whether ``value`` is an int or a float (not a bool) that a float holds as a finite
    number: ``10**400`` is not, as it would overflow where it is used."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
