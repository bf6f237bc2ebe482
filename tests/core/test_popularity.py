"""Prefix popularity over a window of recent requests (``gateway.core.popularity``)."""

from __future__ import annotations

import pytest

from gateway.core.popularity import RecentShare


def test_a_key_sent_with_every_request_needs_every_upstream_once_the_window_is_full() -> None:
    recent = RecentShare(128)
    for _ in range(128):
        recent.seen(7)
    assert recent.share(7) == 1.0
    assert recent.upstreams_needed(7, 4) == 4


def test_shares_count_against_a_quarter_window_at_least() -> None:
    """The first requests a router sees do not make their prefix look like all traffic;
    from a quarter window on, shares are of the requests counted."""
    recent = RecentShare(128)
    for _ in range(3):
        recent.seen(7)
    assert recent.share(7) == pytest.approx(3 / 32)
    assert recent.upstreams_needed(7, 4) == 1
    for _ in range(29):
        recent.seen(7)
    assert recent.share(7) == 1.0
    assert recent.upstreams_needed(7, 4) == 4


@pytest.mark.parametrize(
    ("count", "needed"), [(0, 1), (1, 1), (32, 1), (33, 2), (64, 2), (65, 3), (128, 4)]
)
def test_a_key_needs_one_upstream_per_fair_share_it_fills(count: int, needed: int) -> None:
    recent = RecentShare(128)
    for i in range(128):
        recent.seen(7 if i < count else 1000 + i)
    assert recent.upstreams_needed(7, 4) == needed


def test_the_oldest_requests_stop_counting_and_memory_stays_bounded() -> None:
    recent = RecentShare(10)
    for key in range(1000):
        recent.seen(key)
    assert recent.share(5) == 0.0
    assert recent.share(999) == pytest.approx(0.1)
    assert len(recent) == 10


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be at least 1"):
        RecentShare(0)
