"""The control law on its own: what it decides for each kind of round."""

from __future__ import annotations

import pytest

from obleth_kv_pressure import Knobs, Law, Signals

LAW = Law(Knobs())


def signals(
    *,
    kv: float | None = 0.5,
    preemptions: float = 0,
    queued: float = 0,
    serving: float = 100,
    fresh: int = 2,
) -> Signals:
    return Signals(fresh, kv, preemptions, queued, serving)


def test_a_preemption_cuts_the_limit_then_holds_while_cooling_down() -> None:
    first = LAW.next(100, 200, signals(preemptions=3), cooling=0)
    assert (first.limit, first.cooling) == (70, 2)
    assert first.reason == "decrease: 3 preemptions"
    # the readings after a cut still show the load from before it
    held = LAW.next(first.limit, 200, signals(preemptions=1), first.cooling)
    assert (held.limit, held.cooling) == (70, 1)
    assert "cooling down" in held.reason


def test_kv_usage_over_the_high_mark_cuts_without_any_preemption() -> None:
    decision = LAW.next(50, 200, signals(kv=0.95), cooling=0)
    assert decision.limit == 35
    assert "KV usage 0.95 >= 0.92" in decision.reason


def test_room_and_a_limit_in_use_grow_it_by_one_or_a_twentieth() -> None:
    assert LAW.next(10, 200, signals(kv=0.3, serving=10), 0).limit == 11
    assert LAW.next(100, 200, signals(kv=0.3, serving=95), 0).limit == 105


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        (signals(kv=0.3, serving=50), "hold: the limit is not in use"),
        (signals(kv=0.3, queued=2), "hold: backends keep requests waiting"),
        (signals(kv=0.85), "hold: KV usage 0.85 between the marks"),
        (signals(fresh=0), "hold: no fresh reading from any backend"),
    ],
)
def test_it_holds_when_growing_would_be_blind_or_useless(given: Signals, reason: str) -> None:
    decision = LAW.next(100, 200, given, 0)
    assert (decision.limit, decision.reason) == (100, reason)


def test_it_never_leaves_the_floor_or_the_operators_ceiling() -> None:
    law = Law(Knobs(floor=4))
    assert law.next(5, 200, signals(preemptions=1), 0).limit == 4
    assert law.next(4, 200, signals(preemptions=1), 0).limit == 4
    # the operator cut the static limit to 60: the computed one follows at once
    assert law.next(100, 60, signals(kv=0.85), 0).limit == 60
    at_top = law.next(60, 60, signals(kv=0.3, serving=60), 0)
    assert (at_top.limit, at_top.reason) == (60, "hold: at the operator's limit")


def test_a_floor_above_the_operators_ceiling_stops_at_the_ceiling() -> None:
    """The operator's limit wins: a ``FLOOR`` of 100 under a ceiling of 64 used to hold
    the computed limit at 100, over the ceiling."""
    law = Law(Knobs(floor=100))
    assert law.next(100, 64, signals(preemptions=1), 0).limit == 64
    assert law.next(100, 64, signals(kv=0.3, serving=100), 0).limit == 64


def test_without_kv_figures_preemptions_and_queues_still_steer_it() -> None:
    assert LAW.next(100, 200, signals(kv=None, preemptions=2), 0).limit == 70
    assert LAW.next(100, 200, signals(kv=None, serving=100), 0).limit == 105
