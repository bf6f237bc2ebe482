"""Which engine metric names feed which ``Reading`` field: the one place that knows them.

Metric names drift between engines and between versions of one engine. Teaching the
gateway a new engine or a renamed metric is an edit to ``ENGINES`` and nothing else.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.routing.promtext import Sample, parse_samples
from gateway.routing.readings import Reading


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The metric names one engine exports for each field of a ``Reading``.

    Each field lists names in order of preference: the first name with a usable sample
    in a scrape is the one read, so a newer name wins over an older one that a version
    in between exported as well.
    """

    engine: str
    running: Sequence[str]
    waiting: Sequence[str]
    kv_usage: Sequence[str]
    preemptions: Sequence[str] = ()
    """A counter of sequences the engine evicted from its batch for want of KV cache."""

    @property
    def names(self) -> frozenset[str]:
        """Every metric name of this engine."""
        return frozenset((*self.running, *self.waiting, *self.kv_usage, *self.preemptions))


MODEL_LABEL = "model_name"
"""The label vLLM and SGLang put on their samples, naming the model they serve."""

ENGINES: tuple[EngineMetrics, ...] = (
    EngineMetrics(
        engine="vllm",
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are fractions
        # 0..1 despite the "perc".
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        preemptions=("vllm:num_preemptions_total",),
    ),
    EngineMetrics(
        engine="sglang",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_usage=("sglang:token_usage",),
    ),
)
"""Known engines, in the order they are tried when a scrape has names of several."""

METRIC_NAMES: frozenset[str] = frozenset(name for engine in ENGINES for name in engine.names)
"""Every metric name any known engine exports; the only lines a scrape parses."""


def reading_from_text(upstream: str, text: str, at: float, healthy: bool) -> Reading:
    """The ``Reading`` of ``upstream`` that the metrics ``text`` scraped at ``at`` show.

    - ``engine`` is the first engine of ``ENGINES`` with at least one usable sample in
      ``text``, and every number comes from that engine's names; None when no known
      name has a usable sample, and then every number is None too.
    - Samples of one name under several label sets (one per model, per engine replica)
      add up for ``running``, ``waiting`` and ``preemptions``; ``kv_usage`` is their
      maximum, clamped to [0, 1], since the fullest cache is the one a new request may not
      fit in.
    - A NaN sample is no sample; so is an infinite ``running`` or ``waiting``, and a
      negative count is read as 0. A field whose names have no usable sample is None.
    - ``models`` holds the ``model_name`` labels of that engine's samples (None when
      they have none): the names the upstream serves models under.
    - Never raises on bad text: malformed lines are skipped (see ``promtext``).
    """
    found: dict[str, list[float]] = {}
    models: dict[str, set[str]] = {}
    for sample in _usable(parse_samples(text, METRIC_NAMES)):
        found.setdefault(sample.name, []).append(sample.value)
        model = sample.labels.get(MODEL_LABEL)
        if model:
            models.setdefault(sample.name, set()).add(model)
    for engine in ENGINES:
        if found.keys() & engine.names:
            named = set().union(*(models.get(name, ()) for name in engine.names))
            return Reading(
                upstream,
                healthy=healthy,
                running=_count(_first(found, engine.running)),
                waiting=_count(_first(found, engine.waiting)),
                kv_usage=_fraction(_first(found, engine.kv_usage)),
                preemptions=_count(_first(found, engine.preemptions)),
                at=at,
                engine=engine.engine,
                models=frozenset(named) or None,
            )
    return Reading(upstream, healthy=healthy, at=at)


def _usable(samples: Iterable[Sample]) -> Iterable[Sample]:
    return (sample for sample in samples if not math.isnan(sample.value))


def _first(found: dict[str, list[float]], names: Sequence[str]) -> list[float]:
    """The values of the first of ``names`` present in ``found``; empty when none is."""
    for name in names:
        if name in found:
            return found[name]
    return []


def _count(values: list[float]) -> float | None:
    """The sum of a count's samples, each negative one read as 0 (a count never is); a
    sum too large for a float is the largest float, so that scorers still compare it."""
    finite = [max(0.0, value) for value in values if math.isfinite(value)]
    if not finite:
        return None
    try:
        return math.fsum(finite)
    except OverflowError:
        return sys.float_info.max


def _fraction(values: list[float]) -> float | None:
    return min(1.0, max(0.0, max(values))) if values else None
