"""The control law on synthetic first-byte times: what it does to the limit when first
bytes come fast, come slowly, or describe a limit that no longer holds, and how it probes
the no-load time. Time is passed in, so every test is deterministic."""

from __future__ import annotations

import pytest
from adaptive_runs import Run, cut_at, probed

from obleth_adaptive.law import STUCK_WINDOWS

# -- the first probe ------------------------------------------------------------------------


def test_the_first_probe_measures_the_no_load_time_then_starts_slowly() -> None:
    """The law starts at the probe limit; the median of the probe's samples becomes the
    no-load time, and the slow start begins at the probe limit (not at the operator's
    limit, which would pour the queue of a start under load into the backends)."""
    run = Run(probe_limit=3, probe_samples=3)
    assert run.law.probing
    assert run.law.limit() == 3
    assert run.feed(0.1) == [3]
    assert run.feed(0.3) == [3]
    assert run.feed(0.12) == [3]
    assert run.law.baseline == pytest.approx(0.12)
    assert not run.law.probing


def test_the_slow_start_adds_a_seat_per_first_byte_within_the_tolerance() -> None:
    """Each first byte within 4x the no-load time adds one seat at once, windows or not
    (a window adds nothing of its own); a slower one adds none and ends nothing."""
    run = probed(0.1, probe_limit=3)
    assert run.feed(0.1, 5) == [4, 5, 6, 7, 8]
    assert run.feed(0.45, 2) == [8, 8]
    assert run.feed(0.1) == [9]
    assert run.law.reason == "slow start: a first byte in 1.00x the no-load time"


def test_the_slow_start_begins_at_the_floor_when_that_is_above_the_probe_limit() -> None:
    run = probed(0.1, floor=10, probe_limit=3)
    assert run.law.limit() == 10
    assert run.feed(0.1, 2) == [11, 12]


def test_a_limit_that_starts_at_the_ceiling_has_no_slow_start() -> None:
    """Nothing to grow to: with the ceiling at the probe limit, a ceiling raised later is
    grown to by windows, as after a slow start that reached it."""
    run = probed(0.1, probe_limit=3, ceiling=3)
    assert run.feed(0.1, 2) == [3, 3]
    run.ceiling = 64
    assert run.feed(0.1, 6) == [4, 4, 4, 4, 6, 6]  # windows of 3 at 3, then of 4


def test_the_first_cut_ends_the_slow_start() -> None:
    """A window of slow first bytes cuts as at any time; from then on the limit grows by
    windows, not by first bytes."""
    run = probed(0.1, probe_limit=3)
    assert run.feed(0.1, 4) == [4, 5, 6, 7]  # a whole window (of 4)
    assert run.windows(0.8, 1) == [3]  # halved
    assert run.feed(0.1, 4) == [3, 3, 5, 5]  # a window of 3: + 1.9, the square root of 3.5


def test_the_slow_start_ends_when_it_grows_to_the_ceiling() -> None:
    """Grown to the operator's limit, the slow start is over: a ceiling raised later is
    grown to by windows. A ceiling lowered under the limit for a while does not end it."""
    run = probed(0.1, probe_limit=3, ceiling=20)
    assert run.feed(0.1, 2) == [4, 5]
    run.ceiling = 4
    assert run.feed(0.1, 2) == [4, 4]
    run.ceiling = 20
    assert run.feed(0.1, 16) == list(range(5, 21))
    run.ceiling = 40
    assert run.feed(0.1, 4) == [20, 20, 20, 24]  # a window's growth (+ 4.5), not + 1 each
    assert run.law.reason.startswith("increase")


def test_after_the_first_probe_an_initial_limit_applies_when_set() -> None:
    """``initial`` is the limit the first probe opens to, instead of a slow start."""
    run = probed(initial=16)
    assert run.law.limit() == 16


def test_a_floor_or_an_initial_limit_above_the_ceiling_stops_at_the_ceiling() -> None:
    """The operator's limit wins over ``FLOOR`` and ``INITIAL`` set above it (a floor of
    100 under a ceiling of 64 used to hold the limit at 100), while probing, after the
    probe, and after a cut."""
    run = Run(floor=100, probe_limit=3)
    assert run.law.limit() == 64
    run.feed(0.1, run.law.knobs.probe_samples)
    assert run.law.limit() == 64
    assert run.windows(0.8, 1) == [64]
    assert probed(initial=1000).law.limit() == 64


def test_before_any_cut_flat_first_bytes_grow_the_limit_by_its_square_root() -> None:
    """At the no-load time, a limit in use that was never cut grows by its square root
    each window: fast while small, then gently."""
    run = probed(0.1, initial=4)
    assert run.windows(0.1, 4) == [6, 8, 11, 14]
    assert run.law.reason.startswith("increase")


# -- cutting --------------------------------------------------------------------------------


def test_rising_first_bytes_shrink_the_limit_in_proportion() -> None:
    """First bytes at 5x the no-load time, over the default tolerance of 4: each window
    cuts the limit to 4/5 of itself; at 8x and beyond, a window halves it, no more."""
    run = probed(0.1, initial=64)
    assert run.windows(0.5, 2) == [51, 40]  # 64 * 0.8 = 51.2, then 40.96
    assert run.windows(1.0, 2) == [20, 10]  # 10x: capped at halving
    assert run.law.reason.startswith("decrease")


def test_first_bytes_within_the_default_tolerance_do_not_cut() -> None:
    """At 4x the no-load time (the default tolerance) the limit is not cut: on a batching
    backend a first token waits for the running step even at the best limit."""
    run = probed(0.1, initial=8, in_use=lambda limit: False)
    assert run.windows(0.4, 3) == [8, 8, 8]


def test_a_cut_lowers_the_limit_by_at_least_one() -> None:
    """Just above the tolerance the ratio barely cuts: the limit still falls by one."""
    run = probed(0.1, initial=10)
    assert run.windows(0.401, 3) == [9, 8, 7]


def test_the_limit_never_falls_below_the_floor() -> None:
    """However slow first bytes get, the limit stays at the floor."""
    run = probed(0.1, floor=5, initial=12)
    assert run.windows(10.0, 4) == [6, 5, 5, 5]


# -- growing back after a cut ---------------------------------------------------------------


def test_after_a_cut_the_limit_grows_by_its_square_root_back_to_near_the_cut() -> None:
    """Cut from 100 to 50, the limit grows by its square root per window, and the last
    step is shortened to land at 0.9 of the limit that was cut (90), not past it."""
    run = probed(0.1, initial=100, ceiling=1000)
    cut_at(run, 100)
    assert run.windows(0.1, 5) == [57, 64, 72, 81, 90]  # 81.2 + 8.8 = 90, not + 9.0


def test_past_near_the_cut_the_limit_creeps_up_by_1_1_2_2_3_3() -> None:
    """From 0.9 of the limit that was cut, each window that allows growth adds 1, 1, 2,
    2, 3, 3, ...: the limit tries beyond where first bytes last slowed, carefully."""
    run = probed(0.1, initial=100, ceiling=1000)
    cut_at(run, 100)
    run.windows(0.1, 5)  # back at 90
    assert run.windows(0.1, 7) == [91, 92, 94, 96, 99, 102, 106]


def test_the_creep_never_steps_more_than_the_square_root_of_the_limit() -> None:
    """Cut at a limit of 2, the creep past it is held to the square root of the limit:
    8 grows by 2.83 to 10, not by 3 to 11."""
    run = probed(0.1, initial=2, ceiling=1000)
    assert run.windows(1.0, 1) == [1]
    assert run.windows(0.1, 7) == [2, 3, 4, 6, 8, 10, 13]


def test_a_cut_starts_the_creep_again_from_one() -> None:
    """After a second cut, the creep past the new cut starts again at 1, 1, 2, ..., not
    where the last creep had got to."""
    run = probed(0.1, initial=20, ceiling=1000)
    assert run.windows(0.44, 1) == [18]  # 4.4x: 20 * 4/4.4 = 18.2, past 0.9 of 20
    assert run.windows(0.1, 5) == [19, 20, 22, 24, 27]  # + 1, 1, 2, 2, 3
    assert run.windows(0.44, 1) == [24]  # 27.2 * 4/4.4 = 24.7, past 0.9 of 27.2
    assert run.windows(0.1, 3) == [25, 26, 28]  # + 1, 1, 2 again


# -- holding --------------------------------------------------------------------------------


def test_a_limit_not_in_use_does_not_grow() -> None:
    """Fast first bytes with few requests running say nothing about more: it holds."""
    run = probed(0.1, initial=4, in_use=lambda limit: False)
    assert run.windows(0.1, 3) == [4, 4, 4]
    assert run.law.reason == "hold: the limit is not in use"


def test_without_grow_within_the_limit_grows_up_to_the_tolerance() -> None:
    """``grow_within`` unset, there is no band where the limit holds: first bytes at 3.9x
    the no-load time still grow it, at 4.1x they cut it."""
    run = probed(0.1, initial=8)
    assert run.windows(0.39, 1) == [10]
    assert run.windows(0.41, 1) == [9]


def test_between_grow_within_and_the_tolerance_the_limit_holds() -> None:
    """With ``grow_within`` 1.5 and the tolerance 4, first bytes at 1.8x or 3.9x neither
    grow nor cut the limit; at 1.4x it grows."""
    run = probed(0.1, initial=8, grow_within=1.5)
    assert run.windows(0.18, 2) == [8, 8]
    assert run.windows(0.39, 2) == [8, 8]
    assert run.law.reason.startswith("hold: first bytes take 3.90x")
    assert run.windows(0.14, 1) == [10]


def test_growth_stops_at_the_ceiling_and_follows_it_down() -> None:
    """The limit never passes the operator's limit, even when it is lowered later."""
    run = probed(0.1, initial=50, ceiling=60)
    assert run.windows(0.1, 3) == [57, 60, 60]
    assert run.law.reason == "hold: at the operator's limit"
    run.ceiling = 20
    assert run.law.limit() == 20
    assert run.windows(0.1, 1) == [20]
    run.ceiling = 40
    assert run.windows(0.1, 1) == [24]  # grows again from where it was held: 20 + 4.47


# -- what a window is -----------------------------------------------------------------------


def test_the_window_median_ignores_one_slow_first_byte() -> None:
    """One long prompt in a window does not cut the limit; most of the window decides."""
    run = probed(0.1, initial=9)
    assert run.feed(0.1, 3) == [9, 9, 9]
    assert run.feed(5.0) == [12]  # the median of 0.1, 0.1, 0.1 and 5.0 is 0.1: growth


def test_a_low_limit_decides_on_a_short_window() -> None:
    """Below ``window`` (10 here), a window has as many samples as the limit, and never
    fewer than three: a low limit gets few first bytes, and must not wait long."""
    run = probed(0.1, window=10, initial=3, ceiling=1000)
    assert run.feed(0.1, 3) == [3, 3, 4]  # at 3: three samples
    assert run.feed(0.1, 4) == [4] * 3 + [6]  # at 4: four
    assert run.feed(0.1, 6) == [6] * 5 + [9]  # at 6: six
    assert run.feed(0.1, 10) == [9] * 8 + [12, 12]  # at 9: nine
    assert run.feed(0.1, 9) == [12] * 8 + [16]  # at 12: ten, the window
    run = probed(0.1, window=10, initial=1)
    assert run.feed(0.1, 3) == [1, 1, 2]  # at 1: three, not one


def test_a_sample_handed_over_before_a_change_does_not_count() -> None:
    """A first byte of a request handed to the app before the last change describes the
    old limit: it neither fills a window nor cuts a second time."""
    run = probed(0.1, initial=32)
    assert run.windows(0.8, 1) == [16]
    changed = run.now
    # first bytes of requests handed over before the cut, however slow: ignored
    for _ in range(8):
        run.now += 0.001
        run.law.sample(run.now - changed + 0.5, run.now)
    assert run.law.limit() == 16
    assert run.windows(0.1, 1) == [20]  # the next requests are counted again


# -- probes ---------------------------------------------------------------------------------


def test_the_periodic_probe_comes_after_probe_every_limits_worth_of_samples() -> None:
    """Each sample counts one over the limit at the time it comes: held at 8 with
    ``probe_every`` 2, the probe comes after 16 samples (four windows of 4); growing from
    4, windows at 4, 6 and 8 count 1 + 2/3 + 1/2 limits, so it comes after the third
    window, although 2 x 4 samples were counted after the second."""
    run = probed(0.1, initial=8, probe_every=2, in_use=lambda limit: False)
    assert run.windows(0.1, 3) == [8, 8, 8]
    assert not run.law.probing
    run.windows(0.1, 1)
    assert run.law.probing
    run = probed(0.1, initial=4, probe_every=2)
    assert run.windows(0.1, 2) == [6, 8]
    assert not run.law.probing
    run.windows(0.1, 1)
    assert run.law.probing


def test_the_law_probes_periodically_and_follows_a_rising_no_load_time() -> None:
    """The backend gets slower at no load (0.1 s to 0.5 s): the law cuts, then its next
    probe (due after one limit's worth of samples) measures the new no-load time, the
    limit comes back, and grows again."""
    run = probed(0.1, initial=8, probe_every=1, probe_limit=2)
    assert run.windows(0.5, 2) == [6, 2]  # 5x: cut to 6.4, then to 5.1 and probing
    assert run.law.probing
    assert run.feed(0.5, 3) == [2, 2, 5]  # back to 5.1 once measured
    assert not run.law.probing
    assert run.law.baseline == pytest.approx(0.5)
    assert run.windows(0.5, 1) == [6]  # at the new no-load time: growth


def test_a_probe_never_raises_the_limit() -> None:
    """A limit already under the probe limit stays where it is while probing."""
    run = probed(0.1, initial=2, probe_limit=3, probe_every=1, in_use=lambda limit: False)
    assert run.windows(0.1, 1) == [2]  # 3 samples at 2, 1.5 limits' worth: probing
    assert run.law.probing


def test_a_probe_without_samples_ends_at_its_deadline_and_keeps_the_old_no_load_time() -> None:
    """Nothing gets a first byte while probing (long answers hold every seat): at the
    deadline the limit comes back and the no-load time stays as it was."""
    run = probed(0.1, initial=8, probe_every=1, probe_timeout_s=5.0)
    assert run.windows(0.1, 3) == [10, 14, 3]  # grown to 10.8, 14.1, then 17.9 and probing
    assert run.law.probing
    run.law.expire(run.now + 4.9)
    assert run.law.probing
    run.law.expire(run.now + 5.0)
    assert not run.law.probing
    assert run.law.limit() == 17
    assert run.law.baseline == pytest.approx(0.1)
    assert "timed out" in run.law.reason


def test_a_late_sample_ends_a_probe_past_its_deadline_with_what_it_measured() -> None:
    """A probe past its deadline ends on the next sample, with the samples it has."""
    run = probed(0.1, initial=8, probe_every=1, probe_timeout_s=5.0, probe_samples=3)
    run.windows(0.1, 3)
    assert run.law.probing
    run.feed(0.2)  # one sample measured in time
    run.now += 10.0
    run.feed(0.25)  # past the deadline: the probe ends first, with 0.2 alone
    assert not run.law.probing
    assert run.law.baseline == pytest.approx(0.2)


def test_a_limit_stuck_at_the_floor_probes_early() -> None:
    """Windows ending at the floor with slow first bytes call a probe before it is due."""
    run = probed(0.1, initial=2)
    assert run.windows(1.0, STUCK_WINDOWS - 1) == [1] * (STUCK_WINDOWS - 1)
    assert not run.law.probing
    run.windows(1.0, 1)
    assert run.law.probing


def test_garbage_samples_are_ignored() -> None:
    """A negative, infinite or NaN time is no measurement."""
    run = Run()
    for bad in (-1.0, float("inf"), float("nan")):
        run.law.sample(bad, run.now)
    assert run.law.probing
    assert run.law.baseline is None
