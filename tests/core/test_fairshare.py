"""Weighted max-min fair shares: the yardstick for the scheduler and the demo."""

from __future__ import annotations

import pytest

from gateway.core.fairshare import fair_shares


@pytest.mark.parametrize(
    ("capacity", "demands", "weights", "expected"),
    [
        (70, {"a": 100, "b": 100, "c": 100}, {"a": 4, "b": 2, "c": 1}, {"a": 40, "b": 20, "c": 10}),
        (10, {"a": 100, "b": 1}, {}, {"a": 9, "b": 1}),
        (10, {"a": 3, "b": 3}, {}, {"a": 3, "b": 3}),
        (12, {"a": 100, "b": 100, "c": 1}, {"a": 2}, {"a": 22 / 3, "b": 11 / 3, "c": 1}),
        (5, {"a": 0, "b": 10}, {}, {"a": 0, "b": 5}),
    ],
)
def test_shares_follow_weighted_max_min(
    capacity: float,
    demands: dict[str, float],
    weights: dict[str, float],
    expected: dict[str, float],
) -> None:
    """Backlogged tenants split by weight; light tenants get what they ask, the rest is shared."""
    shares = fair_shares(capacity, demands, weights)
    assert shares == pytest.approx(expected)
    assert sum(shares.values()) == pytest.approx(min(capacity, sum(demands.values())))
