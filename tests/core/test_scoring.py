"""The weighted sum of scorer outputs and the order upstreams are tried in, as tables."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping

import pytest

from gateway.core.scoring import clamp, normalized, ranked, weighted_totals


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (
            {"prefix-affinity": 5, "queue-depth": 1},
            {"prefix-affinity": 5 / 6, "queue-depth": 1 / 6},
        ),
        ({"queue-depth": 3}, {"queue-depth": 1.0}),
        ({"a": 1, "b": 1, "c": 2}, {"a": 0.25, "b": 0.25, "c": 0.5}),
        ({"a": 0.1, "b": 0.3}, {"a": 0.25, "b": 0.75}),
        # weights whose sum overflows a float (valid each on its own)
        ({"a": 1e308, "b": 1e308}, {"a": 0.5, "b": 0.5}),
    ],
)
def test_weights_are_normalized_to_sum_one(
    weights: dict[str, float], expected: dict[str, float]
) -> None:
    """Weights keep their ratios and their order, and add up to 1."""
    result = normalized(weights)
    assert list(result) == list(weights)
    assert result == pytest.approx(expected)
    assert math.fsum(result.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        (-0.5, 0.0),
        (-1e-12, 0.0),
        (0.0, 0.0),
        (0.25, 0.25),
        (1.0, 1.0),
        (1, 1.0),
        (1.5, 1.0),
        (1e300, 1.0),
        (math.inf, 1.0),
        (-math.inf, 0.0),
        (math.nan, 0.0),
    ],
    ids=[
        "negative",
        "tiny-negative",
        "zero",
        "inside",
        "one",
        "int-one",
        "above-one",
        "huge",
        "inf",
        "minus-inf",
        "nan",
    ],
)
def test_clamp_forces_a_score_into_zero_one(score: float, expected: float) -> None:
    """A scorer's out-of-range answer is cut to [0, 1]; NaN counts as 0."""
    result = clamp(score)
    assert result == expected
    assert isinstance(result, float)


def test_clamp_counts_something_that_is_no_number_as_zero() -> None:
    """A scorer returning garbage (None, text) contributes nothing instead of crashing."""
    assert clamp(None) == 0.0  # type: ignore[arg-type]
    assert clamp("0.7") == 0.0  # type: ignore[arg-type]


NAN = math.nan


@pytest.mark.parametrize(
    ("scores", "weights", "expected"),
    [
        (
            {"p": {"a": 1.0, "b": 0.5}, "q": {"a": 0.0, "b": 1.0}},
            {"p": 0.75, "q": 0.25},
            {"a": 0.75, "b": 0.625},
        ),
        # a score the scorer left out is 0
        ({"p": {"a": 1.0}, "q": {"a": 0.5, "b": 1.0}}, {"p": 0.5, "q": 0.5}, {"a": 0.75, "b": 0.5}),
        # a scorer that answered nothing at all
        ({"q": {"a": 0.4, "b": 0.8}}, {"p": 0.5, "q": 0.5}, {"a": 0.2, "b": 0.4}),
        ({}, {"p": 1.0}, {"a": 0.0, "b": 0.0}),
        # each score is clamped before it is weighted
        ({"p": {"a": 7.0, "b": -3.0}}, {"p": 1.0}, {"a": 1.0, "b": 0.0}),
        ({"p": {"a": NAN, "b": math.inf}}, {"p": 0.5, "q": 0.5}, {"a": 0.0, "b": 0.5}),
        # scores of upstreams that are no candidate are ignored
        ({"p": {"a": 1.0, "z": 1.0}}, {"p": 1.0}, {"a": 1.0, "b": 0.0}),
        # a score from a scorer without a weight does not count
        ({"p": {"a": 1.0}, "x": {"b": 1.0}}, {"p": 1.0}, {"a": 1.0, "b": 0.0}),
    ],
    ids=[
        "weighted",
        "missing-upstream",
        "missing-scorer",
        "no-scores",
        "clamped",
        "nan-and-inf",
        "not-a-candidate",
        "unweighted-scorer",
    ],
)
def test_weighted_totals_table(
    scores: Mapping[str, Mapping[str, float]],
    weights: dict[str, float],
    expected: dict[str, float],
) -> None:
    """``total(u) = Σ w_i · clamp(s_i(u))`` over exactly the candidates."""
    totals = weighted_totals(scores, weights, ["a", "b"])
    assert list(totals) == ["a", "b"]
    assert totals == pytest.approx(expected)


def test_weighted_totals_stay_within_zero_one_with_normalized_weights() -> None:
    """With normalized weights every total is in [0, 1], whatever the scorers return."""
    rng = random.Random(1)
    weights = normalized({"p": 5, "q": 1, "r": 2})
    wild = [-5.0, -0.1, 0.0, 0.3, 1.0, 2.5, math.inf, -math.inf, math.nan]
    for _ in range(200):
        scores = {name: {u: rng.choice(wild) for u in "abcd"} for name in weights}
        for total in weighted_totals(scores, weights, list("abcd")).values():
            assert 0.0 <= total <= 1.0 + 1e-12


def no_inflight(upstream: str) -> int:
    return 0


@pytest.mark.parametrize(
    ("totals", "inflight", "expected"),
    [
        ({"a": 0.2, "b": 0.9, "c": 0.5}, {}, ["b", "c", "a"]),
        # a higher total wins even against many more requests in flight
        ({"a": 0.6, "b": 0.5}, {"a": 10}, ["a", "b"]),
        # equal totals: the fewest in flight first
        ({"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 3, "c": 1}, ["b", "c", "a"]),
        ({"a": 0.5, "b": 0.5, "c": 0.1}, {"a": 2, "b": 1}, ["b", "a", "c"]),
    ],
    ids=["by-total", "total-beats-inflight", "tie-by-inflight", "mixed"],
)
def test_ranked_orders_by_total_then_fewest_in_flight(
    totals: dict[str, float], inflight: dict[str, int], expected: list[str]
) -> None:
    """Best total first; among equal totals the upstream with fewer requests in flight."""
    for seed in range(20):
        assert ranked(totals, lambda u: inflight.get(u, 0), random.Random(seed)) == expected


TIED = {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}


def test_full_ties_are_ordered_the_same_for_the_same_seed() -> None:
    """The random tie-break is reproducible: the same seed gives the same order."""
    for seed in range(50):
        first = ranked(TIED, no_inflight, random.Random(seed))
        again = ranked(TIED, no_inflight, random.Random(seed))
        assert first == again
        assert sorted(first) == sorted(TIED)


def test_full_ties_are_ordered_differently_for_different_seeds() -> None:
    """The order of a full tie comes from the seed, not from the candidates' position."""
    orders = {tuple(ranked(TIED, no_inflight, random.Random(seed))) for seed in range(50)}
    assert len(orders) > 1


def test_full_ties_do_not_pile_onto_one_position() -> None:
    """Over 200 tied decisions drawn from one generator every upstream is chosen often."""
    rng = random.Random(2024)
    winners = Counter(ranked(TIED, no_inflight, rng)[0] for _ in range(200))
    assert set(winners) == set(TIED)
    # 50 expected each; 20 is about five standard deviations below
    assert min(winners.values()) >= 20, winners
