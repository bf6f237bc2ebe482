"""Parsing of ``name:value`` lists: weights (``gold:4,free:1``, ``prefix-affinity:5,queue-depth:1``)
and caps (``free:4,*:16``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from gateway.core.numbers import finite

_V = TypeVar("_V")


class WeightSyntaxError(ValueError):
    """The text is not a list of ``name:weight`` pairs; the message says which part."""


def parse_weights(text: str, *, allow_bare: bool = False) -> dict[str, float]:
    """Parse ``"a:4,b:1"`` into ``{"a": 4.0, "b": 1.0}``.

    Names are kept as written (whitespace around them is dropped). Every weight must be a
    finite number greater than zero; a name may appear once. With ``allow_bare`` a name
    without ``:weight`` counts as weight 1. An empty text gives an empty mapping.
    """
    return parse_pairs(text, _parse_weight, what="weight", bare="1" if allow_bare else None)


def parse_pairs(
    text: str, value_of: Callable[[str, str], _V], *, what: str, bare: str | None = None
) -> dict[str, _V]:
    """Parse ``"a:x,b:y"`` into ``{"a": value_of("a", "x"), "b": value_of("b", "y")}``.

    The rules of :func:`parse_weights` for names; ``value_of`` raises
    ``WeightSyntaxError`` for a value it cannot use. A name without ``:value`` stands for
    ``bare`` (when None, that is an error, which calls the value ``what``).
    """
    result: dict[str, _V] = {}
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        name, sep, value_text = part.partition(":")
        name = name.strip()
        if not name:
            raise WeightSyntaxError(f"{part!r} has no name before ':'")
        if not sep:
            if "=" in name:  # "gold=4": the value after '=', which separates nothing here
                named, _, given = name.partition("=")
                raise WeightSyntaxError(
                    f"{part!r} has no ':{what}' (write {named.strip()}:{given.strip()}; "
                    "the separator is ':', not '=')"
                )
            if bare is None:
                raise WeightSyntaxError(f"{part!r} has no ':{what}' (write {name}:1)")
            value_text = bare
        value = value_of(name, value_text.strip())
        if name in result:
            raise WeightSyntaxError(f"{name!r} is given twice")
        result[name] = value
    return result


def check_weights(weights: Mapping[str, object]) -> dict[str, float]:
    """Validate an already-structured mapping the same way :func:`parse_weights` does."""
    result: dict[str, float] = {}
    for name, weight in named_entries(weights).items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise WeightSyntaxError(f"{name}: weight {weight!r} is not a number")
        if isinstance(weight, int) and not finite(weight):
            raise WeightSyntaxError(f"{name}: weight is too large; it must be a finite number")
        result[name] = _parse_weight(name, repr(weight))
    return result


def named_entries(mapping: Mapping[Any, _V]) -> dict[str, _V]:
    """``mapping`` with whitespace around each name dropped, as :func:`parse_weights`
    drops it: a tenant is named by a header value, which is read without it, so
    ``" gold"`` would never match anyone. Raises ``WeightSyntaxError`` for a key that is
    no name, or a name given twice once stripped."""
    result: dict[str, _V] = {}
    for raw_name, value in mapping.items():
        if not isinstance(raw_name, str) or not raw_name.strip():
            raise WeightSyntaxError(f"{raw_name!r} is not a name")
        name = raw_name.strip()
        if name in result:
            raise WeightSyntaxError(f"{name!r} is given twice")
        result[name] = value
    return result


def format_weights(weights: Iterable[tuple[str, float]]) -> str:
    """The inverse of :func:`parse_weights`, for messages and listings."""
    return ",".join(f"{name}:{weight:g}" for name, weight in weights)


def _parse_weight(name: str, text: str) -> float:
    shown = text if len(text) <= 40 else text[:37] + "..."
    try:
        weight = float(text)
    except ValueError:
        raise WeightSyntaxError(f"{name}: weight {shown!r} is not a number") from None
    if not math.isfinite(weight) or weight <= 0:
        raise WeightSyntaxError(f"{name}: weight {shown!r} must be finite and greater than 0")
    return weight
