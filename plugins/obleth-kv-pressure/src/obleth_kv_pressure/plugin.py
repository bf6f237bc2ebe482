"""The plugin module Obleth loads through the ``obleth`` entry point: it offers the
``kv-pressure`` capacity provider, built with knobs from ``OBLETH_KV_PRESSURE_*``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gateway import ConfigError, Settings, hookimpl

from obleth_kv_pressure.law import Knobs
from obleth_kv_pressure.provider import KvPressureLimit

PREFIX = "OBLETH_KV_PRESSURE_"


def knobs_from(environ: Mapping[str, str]) -> tuple[Knobs, int | None]:
    """The knobs and the initial limit from ``environ``; ``ConfigError`` names a bad one."""
    defaults = Knobs()
    high = _fraction(environ, "HIGH", defaults.high)
    low = _fraction(environ, "LOW", defaults.low)
    if low > high:
        raise ConfigError(
            f"{PREFIX}LOW", low, f"must not be above {PREFIX}HIGH ({high:g}); lower it"
        )
    decrease = _fraction(environ, "DECREASE", defaults.decrease)
    if not 0 < decrease < 1:
        raise ConfigError(
            f"{PREFIX}DECREASE", decrease, "must lie strictly between 0 and 1, e.g. 0.7"
        )
    cooldown = _whole(environ, "COOLDOWN_ROUNDS", 0)
    floor = _whole(environ, "FLOOR", 1)
    knobs = Knobs(
        high=high,
        low=low,
        decrease=decrease,
        cooldown_rounds=defaults.cooldown_rounds if cooldown is None else cooldown,
        floor=defaults.floor if floor is None else floor,
        use=_fraction(environ, "USE", defaults.use),
    )
    initial = _whole(environ, "INITIAL", knobs.floor)
    return knobs, initial


def _fraction(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(PREFIX + name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ConfigError(PREFIX + name, raw, "expected a fraction from 0 to 1, e.g. 0.9")
    return value


def _whole(environ: Mapping[str, str], name: str, least: int) -> int | None:
    """The whole number in ``OBLETH_KV_PRESSURE_<name>``, None when it is not set."""
    raw = environ.get(PREFIX + name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ConfigError(PREFIX + name, raw, f"expected a whole number of at least {least}")
    return value


def build(settings: Settings) -> KvPressureLimit:
    knobs, initial = knobs_from(os.environ)
    return KvPressureLimit(knobs, initial)


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    return {"kv-pressure": build}
