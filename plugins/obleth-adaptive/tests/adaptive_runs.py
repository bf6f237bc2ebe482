"""A law and a clock for the law's tests: samples and stalls fed at times the test chooses,
so that every test is deterministic. Shared by the law's test modules (on the tests'
``pythonpath``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from obleth_adaptive.knobs import Knobs
from obleth_adaptive.law import MIN_WINDOW, Law


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

    def stall(self, gap: float, *, lasted: float, after: float = 1.0) -> int:
        """A stream's gap of ``gap`` ending ``after`` seconds on; the limit after it."""
        self.now += after
        self.law.stall(gap, lasted, self.now)
        return self.law.limit()

    def windows(self, seconds: float, count: int) -> list[int]:
        """``count`` whole windows of ``seconds``; the limit after each. A window has
        ``window`` samples, or as many as the limit while that is lower (at least
        ``MIN_WINDOW``): test_a_low_limit_decides_on_a_short_window checks that rule."""
        limits = []
        for _ in range(count):
            size = min(self.law.knobs.window, max(MIN_WINDOW, self.law.limit()))
            limits.append(self.feed(seconds, size)[-1])
        return limits


def probed(baseline: float = 0.1, **knobs: object) -> Run:
    """A run past its first probe, which measured ``baseline``."""
    run = Run(**knobs)  # type: ignore[arg-type]
    run.feed(baseline, run.law.knobs.probe_samples)
    assert not run.law.probing
    assert run.law.baseline == pytest.approx(baseline)
    return run


def cut_at(run: Run, limit: int) -> None:
    """Take ``run`` (with ``initial=limit``) through one window at 8x the no-load time:
    halved from ``limit``, which becomes the limit at the last cut."""
    assert run.law.limit() == limit
    assert run.windows(0.8, 1) == [limit // 2]
