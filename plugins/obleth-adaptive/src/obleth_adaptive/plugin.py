"""The plugin module Obleth loads through the ``obleth`` entry point: it offers the
``adaptive`` capacity provider, built with knobs from ``OBLETH_ADAPTIVE_*`` variables."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from gateway import ConfigError, Settings, hookimpl

from obleth_adaptive.law import Knobs
from obleth_adaptive.provider import AdaptiveLimit

PREFIX = "OBLETH_ADAPTIVE_"


def knobs_from(environ: Mapping[str, str]) -> Knobs:
    """The law's knobs from ``environ``; ``ConfigError`` names the first bad variable and
    says what would do."""
    defaults = Knobs()
    floor = _whole(environ, "FLOOR", defaults.floor, least=1)
    initial = (
        None if _raw(environ, "INITIAL") is None else _whole(environ, "INITIAL", 0, least=floor)
    )
    tolerance = _number(environ, "TOLERANCE", defaults.tolerance, above=1.0)
    grow_within = (
        None
        if _raw(environ, "GROW_WITHIN") is None
        else _number(environ, "GROW_WITHIN", tolerance, least=1.0)
    )
    if grow_within is not None and grow_within > tolerance:
        raise ConfigError(
            PREFIX + "GROW_WITHIN",
            environ.get(PREFIX + "GROW_WITHIN"),
            f"must not be above {PREFIX}TOLERANCE ({tolerance:g}): the limit would shrink "
            "and grow on the same first bytes; lower it, or raise the tolerance",
        )
    use = _number(environ, "USE", defaults.use, above=0.0, most=1.0)
    return Knobs(
        floor=floor,
        initial=initial,
        tolerance=tolerance,
        grow_within=grow_within,
        window=_whole(environ, "WINDOW", defaults.window, least=1),
        use=use,
        probe_every=_whole(environ, "PROBE_EVERY", defaults.probe_every, least=0),
        probe_limit=_whole(environ, "PROBE_LIMIT", defaults.probe_limit, least=1),
        probe_samples=_whole(environ, "PROBE_SAMPLES", defaults.probe_samples, least=1),
        probe_timeout_s=_number(environ, "PROBE_TIMEOUT_S", defaults.probe_timeout_s, above=0.0),
    )


def _raw(environ: Mapping[str, str], name: str) -> str | None:
    raw = environ.get(PREFIX + name)
    return None if raw is None or not raw.strip() else raw


def _whole(environ: Mapping[str, str], name: str, default: int, *, least: int) -> int:
    raw = _raw(environ, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ConfigError(PREFIX + name, raw, f"expected a whole number of at least {least}")
    return value


def _number(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    least: float | None = None,
    above: float | None = None,
    most: float | None = None,
) -> float:
    raw = _raw(environ, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    fits = math.isfinite(value) and (least is None or value >= least)
    fits = fits and (above is None or value > above) and (most is None or value <= most)
    if not fits:
        bound = f"at least {least:g}" if least is not None else f"above {above:g}"
        if most is not None:
            bound += f" and at most {most:g}"
        raise ConfigError(PREFIX + name, raw, f"expected a number {bound}, e.g. {default:g}")
    return value


def build(settings: Settings) -> AdaptiveLimit:
    """The provider, with knobs from the environment, under ``global_max_in_flight`` until
    the gateway hands it the operator's limit."""
    return AdaptiveLimit(knobs_from(os.environ), ceiling=settings.global_max_in_flight)


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    """Offer ``adaptive``; Obleth calls the factory only if the user selects that name."""
    return {"adaptive": build}
