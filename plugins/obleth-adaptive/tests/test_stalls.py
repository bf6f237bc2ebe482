"""The control law on streams that stall between two tokens (a backend's preemption):
the cut, which stalls count, and the mark a stall leaves on the limit's growth."""

from __future__ import annotations

import pytest
from adaptive_runs import Run, probed

from obleth_adaptive.law import MARK_LIMITS, MIN_WINDOW, STUCK_WINDOWS


def test_a_stream_that_stalls_cuts_the_limit_at_once() -> None:
    """A gap between two tokens over stall_within (10) times the no-load time is a
    preemption's mark: the limit is cut to 0.7 of itself at once, mid-window."""
    run = probed(0.1, initial=40, ceiling=100)
    run.feed(0.1, 2)  # half a window
    assert run.stall(0.99, lasted=2.0) == 40  # 9.9x: slow steps, not a stall
    assert run.stall(1.01, lasted=2.0) == 28
    assert "stalled 1010 ms" in run.law.reason
    assert run.windows(0.1, 2) == [33, 36]  # back towards 0.9 of 40 as after any cut


def test_streams_handed_over_before_the_last_cut_do_not_cut_again() -> None:
    """Every stream running when the backends preempted may stall: the first cut answers
    them all. A stream handed over after the cut stalling cuts again; so does one after a
    cut for slow first bytes."""
    run = probed(0.1, initial=40, ceiling=100)
    assert run.stall(2.0, lasted=3.0) == 28
    cut = run.now
    assert run.stall(2.0, lasted=3.0, after=0.5) == 28  # handed over before the cut
    assert run.stall(2.0, lasted=run.now + 3.0 - cut - 0.1, after=3.0) == 19  # after it
    assert run.windows(0.8, 1) == [9]  # slow first bytes: halved
    assert run.stall(2.0, lasted=5.0) == 9  # handed over before that cut


def test_stalls_are_ignored_while_probing_before_a_baseline_or_when_off() -> None:
    run = Run(initial=40)
    run.stall(5.0, lasted=6.0)  # the first probe has no baseline yet
    assert run.law.probing
    run.feed(0.1, 3)
    assert run.stall(float("nan"), lasted=1.0) == run.stall(5.0, lasted=-1.0) == 40
    off = probed(0.1, initial=40, ceiling=100, stall_within=0.0)
    assert off.stall(100.0, lasted=101.0) == 40


def test_stalls_at_the_floor_leave_the_windows_to_decide_and_probe() -> None:
    """At the floor a stall has nothing to cut (a floor of 2 stays 2): it must not hold the
    windows back, or a limit stuck there on a stale no-load time would never probe."""
    assert probed(0.1, initial=3, floor=2, ceiling=100).stall(5.0, lasted=6.0) == 2
    run = probed(0.01, initial=1, ceiling=64, probe_samples=3)
    for _ in range(STUCK_WINDOWS * MIN_WINDOW):
        run.stall(0.15, lasted=0.5)  # 15x the stale no-load time
        run.feed(0.2)
        if run.law.probing:
            break
    assert run.law.probing  # the stuck limit probes early, as without stalls
    run.feed(0.2, 3)
    assert run.law.baseline == pytest.approx(0.2)


def test_a_stall_marks_the_limit_it_began_under_until_the_next_probe() -> None:
    """After a stall, the limit grows back to one under the limit in force when the
    stream's last token before the gap came (34 here: not the 40 it was cut from, nor
    the probe's 3 the stream was handed over at), and holds there; the next probe forgets
    the mark, and the limit grows past it."""
    run = probed(0.1, initial=20, ceiling=100, probe_every=2)
    assert run.windows(0.1, 3) == [24, 29, 34]
    began = run.now + 0.1
    assert run.windows(0.1, 1) == [40]
    run.now += 1.5
    gap = run.now - began
    assert run.stall(gap, lasted=run.now - 999.0, after=0.0) == 28
    assert run.law.reason.endswith("under a limit of 34")
    # the mark is the limit cut: back to 0.9 of it, creeping to one under it, and held
    assert run.windows(0.1, 6) == [30, 31, 32, 33, 33, 33]
    assert run.law.reason == "hold: a stream stalled at a limit of 34"
    for _ in range(40):  # held until the periodic probe (two limits' worth of samples)
        if run.law.probing:
            break
        assert run.windows(0.1, 1) in ([33], [3])
    assert run.law.probing
    run.feed(0.1, run.law.knobs.probe_samples)
    assert not run.law.probing
    assert run.windows(0.1, 3) == [34, 35, 37]  # creeping past the mark from +1


def test_a_stall_cuts_to_one_under_a_mark_below_the_usual_cut() -> None:
    """A stream stopped while the slow start was at 6, and resumed at 40: the backends
    preempted with 6 or fewer in flight, so the limit is cut to 5, not to 0.7 of 40."""
    run = probed(0.1, probe_limit=3, ceiling=100)
    assert run.feed(0.1, 3) == [4, 5, 6]
    began = run.now + 0.01
    assert run.feed(0.1, 34)[-1] == 40
    run.now += 1.0
    assert run.stall(run.now - began, lasted=run.now - began + 0.1, after=0.0) == 5
    assert run.windows(0.1, 2) == [5, 5]
    assert run.law.reason == "hold: a stream stalled at a limit of 6"


def test_a_gap_begun_while_probing_marks_the_limit_the_probe_went_back_to() -> None:
    """A stream handed over before a periodic probe, stopped during it (the backends
    still held the load from before) and resumed after it, marks the limit the probe
    went back to, not the probe's own limit of 3."""
    run = probed(0.1, initial=20, ceiling=100, probe_every=1)
    for _ in range(40):
        if run.law.probing:
            break
        run.windows(0.1, 1)
    assert run.law.probing
    run.feed(0.1)
    began = run.now + 0.01
    run.feed(0.1, run.law.knobs.probe_samples - 1)
    assert not run.law.probing
    resumed = run.law.limit()  # where the probe went back to
    run.now += 1.5
    cut = run.stall(run.now - began, lasted=run.now - began + 0.5, after=0.0)
    assert int(resumed * 0.7) <= cut <= int((resumed + 1) * 0.7)  # 0.7 of it, not of 3
    assert run.windows(0.1, 12)[-1] == resumed - 1
    assert run.law.reason == f"hold: a stream stalled at a limit of {resumed}"


def test_a_gap_begun_during_the_first_probe_leaves_no_mark() -> None:
    """The first probe has no limit to go back to: a stream that stopped during it, with
    three or fewer in flight, says nothing of the limit the slow start reached since.
    The stall still cuts, but growth is not held under 3."""
    run = Run(probe_limit=3, probe_samples=3, ceiling=100)
    run.feed(0.1)
    began = run.now
    run.feed(0.1, 2)
    assert not run.law.probing
    assert run.feed(0.1, 37)[-1] == 40
    run.now += 2.0
    assert run.stall(run.now - began, lasted=run.now - began + 0.1, after=0.0) == 28
    assert run.windows(0.1, 6) == [33, 36, 37, 38, 40, 42]  # to 0.9 of 40, then creeping


def test_a_mark_is_forgotten_after_thirty_limits_worth_of_samples_without_probes() -> None:
    """With periodic probes off, a mark still goes: after MARK_LIMITS limits' worth of
    samples the limit grows past it (what the caches hold changes, and a pause that was
    no preemption must not cap the limit for good)."""
    run = probed(0.1, initial=40, ceiling=100, probe_every=0)
    began = run.now
    run.now += 2.0
    assert run.stall(2.0, lasted=run.now - began + 0.5, after=0.0) == 28
    grown = [run.windows(0.1, 1)[0] for _ in range(MARK_LIMITS * 39 // 4 - 10)]
    assert max(grown) == 39
    assert run.law.reason == "hold: a stream stalled at a limit of 40"
    grown = [run.windows(0.1, 1)[0] for _ in range(20)]
    assert max(grown) > 40
