"""The weighted sum of scorer outputs and the order upstreams are tried in."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence


def normalized(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum to 1, order kept."""
    total = sum(weights.values())
    return {name: weight / total for name, weight in weights.items()}


def clamp(score: float) -> float:
    """``score`` forced into [0, 1]; NaN (or anything not a number) counts as 0."""
    if score != score or not isinstance(score, int | float):
        return 0.0
    return 0.0 if score < 0.0 else 1.0 if score > 1.0 else float(score)


def weighted_totals(
    scores: Mapping[str, Mapping[str, float]],
    weights: Mapping[str, float],
    candidates: Sequence[str],
) -> dict[str, float]:
    """``Σ weight_i · clamp(score_i(u))`` per candidate; a score a scorer left out is 0."""
    totals = dict.fromkeys(candidates, 0.0)
    for name, weight in weights.items():
        given = scores.get(name, {})
        for upstream in candidates:
            score = given.get(upstream)
            if score is not None:
                totals[upstream] += weight * clamp(score)
    return totals


def ranked(
    totals: Mapping[str, float], inflight: Callable[[str], int], rng: random.Random
) -> list[str]:
    """Candidates best first: highest total, then fewest in flight, then a random draw.

    The random draw comes from ``rng`` (seeded by the caller), so ties never go to the
    same upstream by position, which is how deterministic routers pile onto one server.
    """
    draw = rng.random
    return sorted(totals, key=lambda u: (-totals[u], inflight(u), draw()))
