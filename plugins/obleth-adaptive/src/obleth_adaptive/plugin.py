"""The plugin module Obleth loads through the ``obleth`` entry point: it offers the
``adaptive`` capacity provider, built with knobs from ``OBLETH_ADAPTIVE_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gateway import PluginKnobs, Settings, hookimpl

from obleth_adaptive.knobs import Knobs
from obleth_adaptive.provider import AdaptiveLimit

PREFIX = "OBLETH_ADAPTIVE_"


def knobs_from(environ: Mapping[str, str]) -> Knobs:
    """The law's knobs from ``environ``; ``ConfigError`` names the first bad variable and
    says what would do."""
    defaults = Knobs()
    env = PluginKnobs(environ, PREFIX)
    floor = env.whole("FLOOR", defaults.floor, least=1)
    initial = env.whole("INITIAL", None, least=floor)
    tolerance = env.number("TOLERANCE", defaults.tolerance, above=1.0)
    grow_within = None
    if env.raw("GROW_WITHIN") is not None:
        grow_within = env.number("GROW_WITHIN", tolerance, least=1.0)
        if grow_within > tolerance:
            raise env.error(
                "GROW_WITHIN",
                env.raw("GROW_WITHIN"),
                f"must not be above {PREFIX}TOLERANCE ({tolerance:g}): the limit would shrink "
                "and grow on the same first bytes; lower it, or raise the tolerance",
            )
    stall_within = env.number("STALL_WITHIN", defaults.stall_within, least=0.0)
    if 0 < stall_within <= 1:
        raise env.error(
            "STALL_WITHIN",
            env.raw("STALL_WITHIN"),
            "must be above 1 (a stream waits a step between two tokens at least), or 0 to "
            "ignore stalls",
        )
    knobs = Knobs(
        floor=floor,
        initial=initial,
        tolerance=tolerance,
        stall_within=stall_within,
        grow_within=grow_within,
        window=env.whole("WINDOW", defaults.window, least=1),
        use=env.number("USE", defaults.use, above=0.0, most=1.0),
        probe_every=env.whole("PROBE_EVERY", defaults.probe_every, least=0),
        probe_limit=env.whole("PROBE_LIMIT", defaults.probe_limit, least=1),
        probe_samples=env.whole("PROBE_SAMPLES", defaults.probe_samples, least=1),
        # at most a day, as the gateway's own seconds settings: 1e20 is a typo, not a wish
        probe_timeout_s=env.number(
            "PROBE_TIMEOUT_S", defaults.probe_timeout_s, above=0.0, most=86_400.0
        ),
    )
    env.done()
    return knobs


def build(settings: Settings) -> AdaptiveLimit:
    """The provider, with knobs from the environment, under ``global_max_in_flight`` until
    the gateway hands it the operator's limit."""
    return AdaptiveLimit(knobs_from(os.environ), ceiling=settings.global_max_in_flight)


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    """Offer ``adaptive``; Obleth calls the factory only if the user selects that name."""
    return {"adaptive": build}
