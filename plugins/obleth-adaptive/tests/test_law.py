"""The control law on synthetic first-byte times: what it does to the limit when first
bytes come fast, come slowly, or describe a limit that no longer holds, and how it probes
the no-load time. Time is passed in, so every test is deterministic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from obleth_adaptive.law import STUCK_WINDOWS, Knobs, Law


class Run:
    """A law and a clock; requests are sent one after the other, each handed to the app
    when the previous one got its first byte."""

    def __init__(
        self,
        ceiling: int = 64,
        in_use: Callable[[int], bool] = lambda limit: True,
        **knobs: object,
    ) -> None:
        self.ceiling = ceiling
        knobs.setdefault("window", 4)
        knobs.setdefault("probe_samples", 3)
        knobs.setdefault("probe_every", 0)
        self.law = Law(Knobs(**knobs), ceiling=lambda: self.ceiling, in_use=in_use)  # type: ignore[arg-type]
        self.now = 1000.0

    def feed(self, seconds: float, count: int = 1) -> list[int]:
        """``count`` samples of ``seconds``; the limit after each."""
        limits = []
        for _ in range(count):
            self.now += seconds
            self.law.sample(seconds, self.now)
            limits.append(self.law.limit())
        return limits

    def windows(self, seconds: float, count: int) -> list[int]:
        """``count`` whole windows of ``seconds``; the limit after each."""
        window = self.law.knobs.window
        return [self.feed(seconds, window)[-1] for _ in range(count)]


def probed(baseline: float = 0.1, **knobs: object) -> Run:
    """A run past its first probe, which measured ``baseline``."""
    run = Run(**knobs)  # type: ignore[arg-type]
    run.feed(baseline, run.law.knobs.probe_samples)
    assert not run.law.probing
    assert run.law.baseline == pytest.approx(baseline)
    return run


def test_the_first_probe_measures_the_no_load_time_then_opens_to_the_ceiling() -> None:
    """The law starts at the probe limit; the median of the probe's samples becomes the
    no-load time, and the limit then opens to the operator's limit."""
    run = Run(probe_limit=3, probe_samples=3)
    assert run.law.probing
    assert run.law.limit() == 3
    assert run.feed(0.1) == [3]
    assert run.feed(0.3) == [3]
    assert run.feed(0.12) == [64]
    assert run.law.baseline == pytest.approx(0.12)
    assert not run.law.probing


def test_after_the_first_probe_an_initial_limit_applies_when_set() -> None:
    """``initial`` replaces the ceiling as the limit the first probe opens to."""
    run = probed(initial=16)
    assert run.law.limit() == 16


def test_rising_first_bytes_shrink_the_limit_in_proportion() -> None:
    """First bytes at 2.5x the no-load time, tolerance 2: each window cuts the limit to
    2/2.5 of itself; at 4x and beyond, a window halves it, no more."""
    run = probed(0.1, tolerance=2.0)
    assert run.windows(0.25, 2) == [51, 40]  # 64 * 0.8 = 51.2, then 40.96
    assert run.windows(1.0, 2) == [20, 10]  # 10x: capped at halving
    assert run.law.reason.startswith("decrease")


def test_a_cut_lowers_the_limit_by_at_least_one() -> None:
    """Just above the tolerance the ratio barely cuts: the limit still falls by one."""
    run = probed(0.1, initial=10, tolerance=2.0)
    assert run.windows(0.201, 3) == [9, 8, 7]


def test_flat_first_bytes_grow_the_limit_while_it_is_in_use() -> None:
    """At the no-load time, a limit in use grows by its square root each window."""
    run = probed(0.1, initial=4)
    assert run.windows(0.1, 4) == [6, 8, 11, 14]
    assert run.law.reason.startswith("increase")


def test_a_limit_not_in_use_does_not_grow() -> None:
    """Fast first bytes with few requests running say nothing about more: it holds."""
    run = probed(0.1, initial=4, in_use=lambda limit: False)
    assert run.windows(0.1, 3) == [4, 4, 4]
    assert run.law.reason == "hold: the limit is not in use"


def test_between_the_growth_band_and_the_tolerance_the_limit_holds() -> None:
    """First bytes at 1.8x, grow_within 1.5 and tolerance 2: neither grow nor cut."""
    run = probed(0.1, initial=8, grow_within=1.5, tolerance=2.0)
    assert run.windows(0.18, 3) == [8, 8, 8]


def test_the_window_median_ignores_one_slow_first_byte() -> None:
    """One long prompt in a window does not cut the limit; most of the window decides."""
    run = probed(0.1, initial=9)
    assert run.feed(0.1, 3) == [9, 9, 9]
    assert run.feed(5.0) == [12]  # the median of 0.1, 0.1, 0.1 and 5.0 is 0.1: growth


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


def test_the_limit_never_falls_below_the_floor() -> None:
    """However slow first bytes get, the limit stays at the floor."""
    run = probed(0.1, floor=5, initial=12)
    assert run.windows(10.0, 4) == [6, 5, 5, 5]


def test_a_sample_handed_over_before_a_change_does_not_count() -> None:
    """A first byte of a request handed to the app before the last change describes the
    old limit: it neither fills a window nor cuts a second time."""
    run = probed(0.1, initial=32)
    assert run.windows(0.4, 1) == [16]
    changed = run.now
    # first bytes of requests handed over before the cut, however slow: ignored
    for _ in range(8):
        run.now += 0.001
        run.law.sample(run.now - changed + 0.5, run.now)
    assert run.law.limit() == 16
    assert run.windows(0.1, 1) == [20]  # the next requests are counted again


def test_the_law_probes_periodically_and_follows_a_rising_no_load_time() -> None:
    """The backend gets slower at no load (0.1 s to 0.25 s): the law cuts, then its next
    probe (due after 1 x 8 samples) measures the new no-load time, the limit comes back,
    and grows again."""
    run = probed(0.1, initial=8, probe_every=1, probe_limit=2)
    assert run.windows(0.25, 2) == [6, 2]  # 2.5x: cut to 6.4, then to 5.1 and probing
    assert run.law.probing
    assert run.feed(0.25, 3) == [2, 2, 5]  # back to 5.1 once measured
    assert not run.law.probing
    assert run.law.baseline == pytest.approx(0.25)
    assert run.windows(0.25, 1) == [7]  # at the new no-load time: growth


def test_a_probe_never_raises_the_limit() -> None:
    """A limit already under the probe limit stays where it is while probing."""
    run = probed(0.1, initial=2, probe_limit=3, probe_every=1)
    run.windows(0.1, 1)  # 2 samples counted and 2 * 1 due: probing (and grown to 3)
    assert run.law.probing
    assert run.law.limit() <= 3


def test_a_probe_without_samples_ends_at_its_deadline_and_keeps_the_old_no_load_time() -> None:
    """Nothing gets a first byte while probing (long answers hold every seat): at the
    deadline the limit comes back and the no-load time stays as it was."""
    run = probed(0.1, initial=8, probe_every=1, probe_timeout_s=5.0)
    assert run.windows(0.1, 2) == [10, 3]  # grown to 10.8, then 14.1 and probing
    assert run.law.probing
    run.law.expire(run.now + 4.9)
    assert run.law.probing
    run.law.expire(run.now + 5.0)
    assert not run.law.probing
    assert run.law.limit() == 14
    assert run.law.baseline == pytest.approx(0.1)
    assert "timed out" in run.law.reason


def test_a_late_sample_ends_a_probe_past_its_deadline_with_what_it_measured() -> None:
    """A probe past its deadline ends on the next sample, with the samples it has."""
    run = probed(0.1, initial=8, probe_every=1, probe_timeout_s=5.0, probe_samples=3)
    run.windows(0.1, 2)
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
