"""The control law, on its own: the limit that keeps the backends' time to first byte
near what it is when they are not loaded. No clock and no I/O: the time of each sample is
passed in, so the law can be driven through any sequence of samples and tested alike."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from obleth_adaptive.history import LimitHistory
from obleth_adaptive.knobs import Knobs

MAX_CUT = 0.5
"""A window's decrease keeps at least this share of the limit: one window of very slow
first bytes (a single huge prompt, say) cannot take the limit to the floor at once."""

NEAR_CUT = 0.9
"""Below this share of the limit at the last cut, the limit grows by its square root per
window; from there on it creeps up by 1, 1, 2, 2, 3, 3, ... (never more than the square
root), so that it comes back fast to where it was cut, then tries beyond it carefully."""

MIN_WINDOW = 3
"""Samples per decision at the least: below ``window`` samples, a window has as many as
the limit (a low limit gets few first bytes per second, and must not wait long for a
decision)."""

STALL_CUT = 0.7
"""A stalled stream multiplies the limit by this (and lowers it by one at least): a stall
is a preemption's mark, and a preemption wastes work done already, so the cut is large
and at once, as a loss cuts TCP's window."""

MARK_LIMITS = 30
"""A mark is forgotten after this many limits' worth of samples (counted as for the
periodic probe), or at the end of a probe if one comes first: what the caches hold
changes with the requests, and a pause that was no preemption must not cap the limit
for good."""

HISTORY = 1024
"""Changes of the limit remembered, to tell which limit a stall began under."""

STUCK_WINDOWS = 5
"""Consecutive windows at the floor with first bytes still too slow after which the law
probes early: the no-load time it compares with has likely risen (a slower model, longer
prompts), and only a probe measures it again."""


@dataclass(slots=True)
class _Probe:
    """A probe under way: the limit is held low until ``samples`` are measured."""

    deadline: float | None
    """When the probe gives up; None for the first probe, which has nothing to go back to."""
    resume: float | None
    """The limit to go back to; None for the first probe (then ``Knobs.initial``)."""
    samples: list[float]


class Law:
    """Gradient-style limit on time to first byte (TTFB), with probes of the no-load TTFB.

    Samples are grouped in windows of ``window`` (while the limit is lower, of as many as
    the limit, but at least ``MIN_WINDOW``); at the end of each, the window's median TTFB
    is compared with the no-load TTFB (the *baseline*) that the last probe measured:

    - above ``tolerance`` times the baseline, requests queue in the backends: the limit is
      multiplied by ``tolerance * baseline / window TTFB`` (but never cut below
      ``MAX_CUT`` of itself in one window), and falls by at least one;
    - within ``grow_within`` times the baseline, with the limit in use (``in_use``) and
      under the ceiling: it grows by its square root (fast while small, then gently) up
      to ``NEAR_CUT`` of the limit at the last cut, then by 1, 1, 2, 2, 3, 3, ... (at
      most the square root) beyond it: back fast to where it was, carefully past it, as
      TCP CUBIC does around the window of its last loss;
    - in between, or while the limit is not in use: it holds.

    Until its first cut, the law is in *slow start*: the first probe leaves the limit at
    ``probe_limit`` (or the floor, if higher), and each first byte within
    ``grow_within`` times the baseline adds one seat (up to the ceiling), whatever the
    window holds. The answered request keeps its seat, so the new one lets one more
    request in, whose first byte adds another: every request that has been answered fast
    keeps one more coming per no-load time, and each request that ends starts such a
    chain again. Growth thus speeds up as requests turn over, and stops as soon as the
    backends queue what they get (a queued request gets no first byte); the first slow
    window or stall cuts, which ends the slow start. It begins once a request handed over
    after the probe is answered (one of the probe's requests must end first). Two seats
    per first byte would double the requests in flight every no-load time, and overshoot
    by as much: in ``obleth simulate`` that cut the capacity benchmark's goodput from
    0.98 of the best static limit's to 0.93, and held four instances of long answers at
    9 responses per second instead of 54. Opening at the ceiling sent the whole queue of
    a start under load to the backends at once, and they preempted until those requests
    ended. Unlike a window's growth, the slow start does not ask whether the limit is in
    use: the readings that say so lag by a polling round, and a slow start that waited
    for them stalled (Obleth's docs/capacity.md). Under a light load it therefore grows
    up to the ceiling. ``initial`` skips the slow start.

    Each stream's *longest gap* between two tokens is checked too, as it grows
    (``stall``): a batching backend sends a running sequence's tokens a step apart, and
    one it preempts for want of KV cache stops until its prefill is computed again. A gap
    above ``stall_within`` times the baseline is such a stall (0: stalls are ignored): the
    limit is multiplied by ``STALL_CUT`` at once, whatever the window holds, unless it is
    at the floor already. A stall of a stream handed over before the last cut, of either
    kind, does not cut again (it describes the limit before, and the cut answered it
    already). The first bytes miss what a stall shows: preemptions begin one or two
    sequences past what the caches hold, while first bytes slow down only further on.
    A stall also *marks* the limit it began under (when the stream's last token before
    the gap came; while a probe was under way, the limit the probe went back to; none
    for a gap begun during the first probe): the cut goes at least to one under the
    lowest mark, which counts as the limit cut (the growth back comes fast to 0.9 of it,
    then creeps), and the limit grows to one under it and holds there. Without the
    mark, growth came back to where the last cut was and crept past it into preemptions
    again, every few seconds. The mark is forgotten at the end of a probe, or after
    ``MARK_LIMITS`` limits' worth of samples since the last stall that cut, since what
    the caches hold changes with the requests; the limit then creeps past it from +1.

    A sample counts only if its request was handed to the app after the last change of
    the limit: one handed over before describes a limit that no longer holds, and would
    make the law cut (or grow) twice for the same cause. The slow start's seats are the
    exception: each first byte moves the limit, and counting only the requests handed
    over since would stop the start.

    A *probe* measures the baseline: the limit drops to ``probe_limit``, so that the
    backends' queues drain, and the median of the next ``probe_samples`` samples (of
    requests handed over after the drop) becomes the baseline; then the limit goes back
    to what it was. The law starts with a probe, probes again after ``probe_every``
    limits' worth of samples (each counting one over the limit when it comes), so that a
    drifting baseline is followed (a probe costs about a limit's worth of requests, so
    spacing probes by a multiple of the limit keeps their share of the throughput about
    the same at any limit), and probes early when the limit has sat at the floor for
    ``STUCK_WINDOWS`` windows with slow first bytes. A probe that does not get its samples
    within ``probe_timeout_s`` ends with those it has (the old baseline stays if it has
    none); the first probe waits as long as it takes.

    The limit always lies between ``floor`` and ``ceiling()``, the operator's limit now,
    which wins over a floor set above it. ``in_use(limit)`` says whether the backends
    serve enough of ``limit`` for growth to mean something.
    """

    def __init__(
        self,
        knobs: Knobs,
        *,
        ceiling: Callable[[], int],
        in_use: Callable[[int], bool] = lambda limit: True,
    ) -> None:
        self.knobs = knobs
        self.ceiling = ceiling
        self.in_use = in_use
        #: the no-load time to first byte, seconds; None until the first probe ends
        self.baseline: float | None = None
        #: the last window's time to first byte, seconds
        self.short: float | None = None
        #: what the last decision was and why, for operators
        self.reason = "probe: measuring the no-load time to first byte"
        self._limit: float | None = None  # None during the first probe
        self._probe: _Probe | None = _Probe(deadline=None, resume=None, samples=[])
        self._since = -math.inf  # samples of requests handed over before this don't count
        self._window: list[float] = []
        self._countdown = math.inf  # limits' worth of samples until the next periodic probe
        self._stuck = 0
        self._last_cut = math.inf  # the limit at the last cut
        self._cut_at = -math.inf  # when the limit was last cut
        self._creep = 0  # increases past NEAR_CUT of the last cut since that cut
        self._slow = False  # in the slow start: one seat more per fast first byte
        self._mark = math.inf  # the lowest limit a stall began under, while remembered
        self._mark_left = math.inf  # limits' worth of samples until the mark is forgotten
        self._history = LimitHistory(HISTORY)

    # -- reading the law --------------------------------------------------------------------

    def limit(self) -> int:
        """The limit now, between the floor and the ceiling (the ceiling wins)."""
        value = self._limit if self._limit is not None else self.knobs.probe_limit
        return min(max(self.knobs.floor, int(value)), self.ceiling())

    @property
    def probing(self) -> bool:
        return self._probe is not None

    @property
    def probe_deadline(self) -> float | None:
        """When the probe under way gives up; None when none is, or for the first one."""
        return None if self._probe is None else self._probe.deadline

    # -- feeding it -------------------------------------------------------------------------

    def sample(self, seconds: float, now: float) -> None:
        """One request's time to first byte, ``seconds``, seen at ``now`` (same clock)."""
        self._sample(seconds, now)
        self._remember(now)

    def _sample(self, seconds: float, now: float) -> None:
        if not 0.0 <= seconds < math.inf:
            return
        self.expire(now)
        if now - seconds < self._since:
            return
        probe = self._probe
        if probe is not None:
            probe.samples.append(seconds)
            if len(probe.samples) >= self.knobs.probe_samples:
                self._end_probe(now)
            return
        self._window.append(seconds)
        limit = self.limit()
        if self._slow:
            self._slow_step(seconds)
        worth = 1 / max(1, limit)  # of a limit: what the probe's and the mark's counts use
        self._countdown -= worth
        self._mark_left -= worth
        if self._mark_left <= 1e-9:
            self._forget_mark()
        if len(self._window) >= min(self.knobs.window, max(MIN_WINDOW, limit)):
            self._decide(now)

    def stall(self, gap: float, lasted: float, now: float) -> None:
        """A stream's longest wait between two tokens so far, ``gap``, ended at ``now``
        (same clock), ``lasted`` seconds after the stream's hand-over."""
        if not (0.0 <= gap < math.inf and 0.0 <= lasted < math.inf):
            return
        self.expire(now)
        self._remember(now)
        baseline, current = self.baseline, self._limit
        within = self.knobs.stall_within
        if self._probe is not None or baseline is None or current is None or within <= 0:
            return
        if now - lasted < self._cut_at or gap <= within * baseline:
            return
        top = self.ceiling()
        floor = min(self.knobs.floor, top)
        current = min(max(current, float(floor)), float(top))
        began_under = self._history.at(now - gap)  # None: before the changes remembered
        mark = self._mark if began_under is None else min(self._mark, float(began_under))
        new = max(float(floor), min(current - 1, current * STALL_CUT, mark - 1))
        if int(new) == int(current):
            # at the floor already: nothing to cut, and the windows go on deciding (the
            # probe a limit stuck at the floor calls for among them)
            return
        self._mark = mark
        self._mark_left = float(MARK_LIMITS)
        self._limit = new
        self._last_cut = min(current, mark)  # growth creeps past the mark, not near current
        self._creep = 0
        self._slow = False
        self._cut_at = self._since = now
        self._remember(now)
        self._window.clear()
        ratio = gap / baseline if baseline > 0 else math.inf
        under = f" under a limit of {mark:.0f}" if mark < current else ""
        self.reason = (
            f"decrease: a stream stalled {gap * 1000:.0f} ms between two tokens "
            f"({ratio:.1f}x the no-load time to first byte){under}"
        )

    def expire(self, now: float) -> None:
        """End the probe under way if its time is up at ``now``; else do nothing."""
        probe = self._probe
        if probe is not None and probe.deadline is not None and now >= probe.deadline:
            self._end_probe(now)
            self._remember(now)

    # -- the limit's history ----------------------------------------------------------------

    def _remember(self, now: float) -> None:
        """Note the limit as it is at ``now``, if it changed since it was last noted. While
        probing, the limit the probe goes back to is noted: a stream stalled then was
        sent back by the load before the probe, not by the probe's low limit. The first
        probe, which has none to go back to, notes nothing: a stream stopped during it,
        or before the oldest change remembered, leaves no mark."""
        probe = self._probe
        if probe is None:
            value = self.limit()
        elif probe.resume is not None:
            value = min(max(self.knobs.floor, int(probe.resume)), self.ceiling())
        else:
            return
        self._history.note(now, value)

    # -- deciding ---------------------------------------------------------------------------

    def _decide(self, now: float) -> None:
        knobs = self.knobs
        short = self.short = statistics.median(self._window)
        self._window.clear()
        assert self._limit is not None
        assert self.baseline is not None
        top = self.ceiling()
        floor = min(knobs.floor, top)  # the operator's limit wins over the floor
        current = min(max(self._limit, float(floor)), float(top))
        ratio = short / self.baseline if self.baseline > 0 else math.inf if short > 0 else 1.0
        grow_within = self._grow_within()
        if ratio > knobs.tolerance:
            gradient = max(MAX_CUT, knobs.tolerance / ratio)
            new = max(float(floor), min(current - 1, current * gradient))
            self._last_cut = current
            self._creep = 0
            self._cut_at = now
            self._slow = False
            self.reason = f"decrease: first bytes take {ratio:.2f}x the no-load time"
        elif ratio > grow_within:
            new = current
            self.reason = f"hold: first bytes take {ratio:.2f}x the no-load time"
        elif current >= top:
            new = current
            self.reason = "hold: at the operator's limit"
        elif self._slow:
            new = current  # the slow start grows on each first byte, not by windows
        elif not self.in_use(int(current)):
            new = current
            self.reason = "hold: the limit is not in use"
        elif current >= self._mark - 1:
            new = current
            self.reason = f"hold: a stream stalled at a limit of {self._mark:.0f}"
        else:
            new = min(float(top), self._mark - 1, current + self._step(current))
            self.reason = f"increase: first bytes take {ratio:.2f}x the no-load time"
        self._limit = new
        if int(new) != int(current):
            self._since = now
        self._stuck = self._stuck + 1 if new <= floor and ratio > knobs.tolerance else 0
        if self._countdown <= 1e-9 or self._stuck >= STUCK_WINDOWS:  # float sums of 1/limit
            self._start_probe(now)

    def _slow_step(self, seconds: float) -> None:
        """The slow start's growth: one seat more for a first byte within the tolerance
        (``grow_within``, if set), up to the ceiling, where the slow start ends (a
        ceiling lowered under the limit only holds it)."""
        assert self._limit is not None
        assert self.baseline is not None
        if seconds > self._grow_within() * self.baseline:
            return
        top = self.ceiling()
        if self._limit >= top:
            return  # a ceiling lowered under the limit: no room, but the slow start goes on
        self._limit = min(float(top), self._limit + 1)
        self._slow = self._limit < top
        ratio = seconds / self.baseline if self.baseline > 0 else 1.0
        self.reason = f"slow start: a first byte in {ratio:.2f}x the no-load time"

    def _forget_mark(self) -> None:
        """Forget the mark; the limit then creeps past it from +1 again."""
        if self._mark < math.inf:
            self._creep = 0
        self._mark = self._mark_left = math.inf

    def _grow_within(self) -> float:
        knobs = self.knobs
        return knobs.tolerance if knobs.grow_within is None else knobs.grow_within

    def _step(self, current: float) -> float:
        """How much the limit grows in a window that allows it (see the class docstring)."""
        near = NEAR_CUT * self._last_cut
        if current < near:
            return min(math.sqrt(current), max(1.0, near - current))
        step = min(math.sqrt(current), 1.0 + self._creep // 2)
        self._creep += 1
        return step

    def _start_probe(self, now: float) -> None:
        knobs = self.knobs
        current = self._limit
        assert current is not None
        self._probe = _Probe(deadline=now + knobs.probe_timeout_s, resume=current, samples=[])
        self._limit = min(current, float(knobs.probe_limit))
        self._since = now
        self._window.clear()
        self._stuck = 0
        self.reason = "probe: measuring the no-load time to first byte"

    def _end_probe(self, now: float) -> None:
        probe = self._probe
        assert probe is not None
        if probe.samples:
            self.baseline = statistics.median(probe.samples)
            self.reason = f"probed: no-load time to first byte {self.baseline * 1000:.1f} ms"
        elif self.baseline is None:
            return  # cannot happen (the first probe has no deadline); keep probing
        else:
            self.reason = "probe timed out without a sample; the no-load time stays"
        knobs = self.knobs
        if probe.resume is not None:
            self._limit = probe.resume
        elif knobs.initial is not None:
            self._limit = float(knobs.initial)
        else:
            self._limit = float(min(max(knobs.floor, knobs.probe_limit), self.ceiling()))
            self._slow = self._limit < self.ceiling()  # started at the ceiling: nothing to grow
        self._probe = None
        self._since = now
        self._window.clear()
        self._stuck = 0
        self._forget_mark()
        every = knobs.probe_every
        self._countdown = every if every > 0 else math.inf
