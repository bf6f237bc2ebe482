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


def test_weights_too_large_to_add_up_still_share_by_their_ratio() -> None:
    """Two weights of 1e308 (which ``--tenants a:1e308,b:1e308`` and ``tenant_weights``
    accept: finite numbers above 0) add up to infinity; the shares used to come out 0,
    and the demo showed a fair share of 0 % for both."""
    assert fair_shares(2, {"a": 5, "b": 5}, {"a": 1e308, "b": 1e308}) == {"a": 1.0, "b": 1.0}
    assert fair_shares(3, {"a": 5, "b": 5}, {"a": 1e308, "b": 5e307}) == {"a": 2.0, "b": 1.0}
    # ratios past what a float holds: the heavy tenant satisfied, the light one gets the rest
    assert fair_shares(10, {"a": 1, "b": 5}, {"a": 1e308, "b": 1e-30}) == {"a": 1.0, "b": 5.0}
