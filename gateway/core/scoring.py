"""The weighted sum of scorer outputs and the order upstreams are tried in."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence


def normalized(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum to 1, order kept; scaled by the largest first, so that
    weights near the largest float do not add up to infinity."""
    largest = max(weights.values(), default=1.0)
    scaled = {name: weight / largest for name, weight in weights.items()}
    total = sum(scaled.values())
    return {name: weight / total for name, weight in scaled.items()}


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
        given = scores.get(name)
        if not given:
            continue
        for upstream in candidates:
            score = given.get(upstream)
            if score is None:
                continue
            # clamp() inlined: this loop runs for every scorer and upstream of every request
            if score > 1.0:
                score = 1.0
            elif not score >= 0.0:  # negative or NaN
                continue
            totals[upstream] += weight * score
    for upstream, total in totals.items():
        if total > 1.0:  # weights summing to 1 + 2**-52 after normalizing
            totals[upstream] = 1.0
    return totals


def best(totals: Mapping[str, float], inflight: Callable[[str], int], rng: random.Random) -> str:
    """The first of ``ranked(totals, ...)``, in one pass: the same rule, without sorting."""
    top = max(totals.values())
    tied = [u for u, total in totals.items() if total == top]
    if len(tied) == 1:
        return tied[0]
    fewest = min(inflight(u) for u in tied)
    tied = [u for u in tied if inflight(u) == fewest]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def ranked(
    totals: Mapping[str, float], inflight: Callable[[str], int], rng: random.Random
) -> list[str]:
    """Candidates best first: highest total, then fewest in flight, then a random draw.

    The random draw comes from ``rng`` (seeded by the caller), so ties never go to the
    same upstream by position, which is how deterministic routers pile onto one server.
    """
    draw = rng.random
    return sorted(totals, key=lambda u: (-totals[u], inflight(u), draw()))
