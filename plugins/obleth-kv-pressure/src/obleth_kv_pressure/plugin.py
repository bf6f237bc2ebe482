"""The plugin module Obleth loads through the ``obleth`` entry point: it offers the
``kv-pressure`` capacity provider, built with knobs from ``OBLETH_KV_PRESSURE_*``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gateway import PluginKnobs, Settings, hookimpl

from obleth_kv_pressure.law import Knobs
from obleth_kv_pressure.provider import KvPressureLimit

PREFIX = "OBLETH_KV_PRESSURE_"


def knobs_from(environ: Mapping[str, str]) -> tuple[Knobs, int | None]:
    """The knobs and the initial limit from ``environ``; ``ConfigError`` names a bad one."""
    defaults = Knobs()
    env = PluginKnobs(environ, PREFIX)

    def fraction(name: str, default: float) -> float:
        return env.number(name, default, least=0.0, most=1.0, expected="a fraction from 0 to 1")

    high = fraction("HIGH", defaults.high)
    low = fraction("LOW", defaults.low)
    if low > high:
        if (environ.get(PREFIX + "LOW") or "").strip():
            raise env.error("LOW", low, f"must not be above {PREFIX}HIGH ({high:g}); lower it")
        raise env.error(  # the operator set HIGH alone, under LOW's default
            "HIGH",
            high,
            f"is below {PREFIX}LOW, whose default is {low:g}; set {PREFIX}LOW too, at or below it",
        )
    decrease = fraction("DECREASE", defaults.decrease)
    if not 0 < decrease < 1:
        raise env.error("DECREASE", decrease, "must lie strictly between 0 and 1, e.g. 0.7")
    knobs = Knobs(
        high=high,
        low=low,
        decrease=decrease,
        cooldown_rounds=env.whole("COOLDOWN_ROUNDS", defaults.cooldown_rounds, least=0),
        floor=env.whole("FLOOR", defaults.floor, least=1),
        use=fraction("USE", defaults.use),
    )
    initial = env.whole("INITIAL", None, least=knobs.floor)
    env.done()
    return knobs, initial


def build(settings: Settings) -> KvPressureLimit:
    if not settings.upstreams:  # no poller, no readings: it would never move
        raise settings.error(
            "capacity_providers",
            ",".join(settings.capacity_providers),
            "kv-pressure reads the backends' metrics, which the gateway polls only when "
            "upstreams are set: set upstreams (OBLETH_UPSTREAMS), or leave kv-pressure out",
        )
    knobs, initial = knobs_from(os.environ)
    return KvPressureLimit(knobs, initial)


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    return {"kv-pressure": build}
