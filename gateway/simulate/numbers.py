"""How ``obleth simulate`` writes a number it was given: as typed, every digit kept."""

from __future__ import annotations


def number(value: float) -> str:
    """``value`` as typed: a whole one without a decimal point, another with every digit
    (``:g`` keeps six, and 1048576 and 1048577 both read ``1.04858e+06``)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)
