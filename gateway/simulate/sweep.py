"""Sweeps: one run per value of one flag, and the value that meets a service-level objective.

``--sweep num-instances=4..16`` runs the same workload (same seed) on 4, 5, ... 16
instances; with ``--slo ttft_p99_ms=500`` the answer is the fewest instances that meet
it. A sweep over ``rate`` or ``max-in-flight`` answers the highest value that meets it
(a limit costs nothing, and the highest admits the most); over ``total-kv-blocks`` or
``max-num-seqs``, the smallest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.simulate.errors import BadFlag
from gateway.simulate.instance import MAX_INSTANCES

#: What may be swept, whether its values are whole numbers, and which end answers.
SWEEPABLE = {
    "num-instances": (int, "smallest"),
    "rate": (float, "largest"),
    "max-in-flight": (int, "largest"),
    "total-kv-blocks": (int, "smallest"),
    "max-num-seqs": (int, "smallest"),
}

#: The largest value of a swept flag that its own checks do not bound (the others are
#: checked as the flag itself is, by the engine's or the gateway's settings).
MOST = {"num-instances": MAX_INSTANCES}

#: Report figures where more is better: an objective on them is a floor. Every other
#: figure (latencies, preemptions, rejections, imbalance) is a ceiling.
HIGHER_IS_BETTER = frozenset(
    {"completed", "responses_per_sec", "tokens_per_sec", "prefix_cache_hit_rate", "fitness"}
)

#: Report figures an objective may name.
OBJECTIVES = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "ttft_mean_ms",
    "e2e_mean_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "scheduling_delay_p99_ms",
    "gateway_wait_p99_ms",
    "responses_per_sec",
    "tokens_per_sec",
    "preemption_count",
    "rejected",
    "completed",
    "prefix_cache_hit_rate",
    "load_imbalance",
    "fitness",
)


@dataclass(frozen=True, slots=True)
class Sweep:
    """The flag swept and its values, in the order they run."""

    flag: str
    values: tuple[float, ...]

    @property
    def answer_end(self) -> str:
        """``smallest`` or ``largest``: which value meeting the objective is the answer."""
        return SWEEPABLE[self.flag][1]


def parse_sweep(text: str) -> Sweep:
    """``NAME=LOW..HIGH``, ``NAME=LOW..HIGH:STEP`` or ``NAME=V1,V2,...``."""
    usage = "NAME=LOW..HIGH, NAME=LOW..HIGH:STEP or NAME=V1,V2,... with NAME one of " + ", ".join(
        SWEEPABLE
    )
    name, _, spec = text.partition("=")
    name = name.strip().removeprefix("--")
    if name not in SWEEPABLE or not spec:
        raise BadFlag("--sweep", text, usage)
    kind = SWEEPABLE[name][0]
    span = None  # for a range: how many steps it spans
    try:
        if ".." in spec:
            bounds, _, step_text = spec.partition(":")
            low_text, _, high_text = bounds.partition("..")
            low, high = kind(low_text), kind(high_text)
            step = kind(step_text) if step_text else kind(1)
            if not step > 0 or not high >= low:
                raise ValueError
            span = (high - low) / step
            values: tuple[float, ...] = ()
        else:
            values = tuple(kind(v) for v in spec.split(","))
    except ValueError:
        raise BadFlag("--sweep", text, usage + " (LOW <= HIGH, STEP > 0)") from None
    if span is not None:  # counted before any value is built (1..inf, a step of 1e-300)
        if not span < 200:
            raise BadFlag("--sweep", text, "between 1 and 200 values, each above 0")
        values = tuple(low + i * step for i in range(math.floor(span + 1e-9) + 1))
    if not values or len(values) > 200 or not all(math.isfinite(v) and v > 0 for v in values):
        raise BadFlag("--sweep", text, "between 1 and 200 values, each above 0")
    most = MOST.get(name)
    if most is not None and max(values) > most:
        raise BadFlag("--sweep", text, f"values of {name} of at most {most}")
    rounded = tuple(round(v, 9) for v in values)
    if not all(rounded):  # 1e-10 is above 0, and 0 once rounded
        raise BadFlag("--sweep", text, "between 1 and 200 values, each at least 1e-9")
    return Sweep(name, rounded)


def parse_slo(text: str) -> dict[str, float]:
    """``figure=bound[,figure=bound]``: ceilings on latencies and counts, floors on rates
    (see `HIGHER_IS_BETTER`)."""
    slo: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if name not in OBJECTIVES:
            raise BadFlag("--slo", text, f"figure=bound pairs; figures: {', '.join(OBJECTIVES)}")
        try:
            bound = float(value)
        except ValueError:
            bound = math.nan
        if not math.isfinite(bound):
            raise BadFlag("--slo", text, f"a number as the bound of {name}")
        if name in slo:  # the stricter or the looser one? a slip either way: say so
            raise BadFlag("--slo", text, f"each figure once; {name} is given twice", told=True)
        slo[name] = bound
    return slo


def meets(report: Mapping[str, object], slo: Mapping[str, float]) -> bool:
    """Whether every objective holds for ``report`` (a figure that is not a number, as a
    latency with no request completed, fails). A run that cut outputs short to fit the KV
    cache meets none: its figures are those of a lighter workload than the one asked
    for, and a sweep over the cache would otherwise answer a cache too small to serve it."""
    if report.get("outputs_cut"):
        return False
    for name, bound in slo.items():
        value = report.get(name)
        if not isinstance(value, int | float) or math.isnan(value):
            return False
        if (value < bound) if name in HIGHER_IS_BETTER else (value > bound):
            return False
    return True


def answer(
    sweep: Sweep, reports: Sequence[Mapping[str, object]], slo: Mapping[str, float]
) -> float | None:
    """The value of the sweep that meets ``slo`` (the smallest or largest, per flag), or
    None when none does."""
    meeting = [v for v, r in zip(sweep.values, reports, strict=True) if meets(r, slo)]
    if not meeting:
        return None
    return min(meeting) if sweep.answer_end == "smallest" else max(meeting)
