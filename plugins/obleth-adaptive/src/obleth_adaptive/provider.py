"""``AdaptiveLimit``: the ``adaptive`` capacity provider, the law of ``law.py`` wired to the
gateway: the gateway's first-byte feed gives it samples, it announces every change of its
limit, and it reads the upstreams' load to tell whether the limit is in use."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway import Readings

from obleth_adaptive.knobs import Knobs
from obleth_adaptive.law import Law

log = logging.getLogger("obleth.adaptive")


class AdaptiveLimit:
    """A limit on requests in flight that follows the backends' time to first byte.

    What the gateway may rely on:

    - ``max_in_flight()`` answers from memory; the law moves the value only inside
      ``first_byte()`` (or when a probe times out, on the event loop), and each such
      change is announced to the ``subscribe``d callbacks, once, after it is made (a
      lowered ceiling lowers the value at once; announcing that is the ceiling's
      provider's part, and the next decision announces where it left this one);
    - the value never exceeds the operator's limit (``use_ceiling``) nor falls below the
      floor;
    - ``first_byte(seconds)`` returns at once and never raises for a number.

    ``clock`` is the clock the samples are placed on; it must be the one the gateway
    measures first bytes with, or a test's. Left out, it is the clock of the gateway's
    readings once they are handed over (``time.monotonic`` in a server, the virtual
    clock of ``obleth simulate``), and ``time.monotonic`` until then.
    """

    def __init__(
        self,
        knobs: Knobs,
        *,
        ceiling: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``ceiling`` is the limit to stay under until the gateway hands over the
        operator's own (``use_ceiling``): ``global_max_in_flight``."""
        self._own_clock = clock is not None
        self._clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._ceiling: Callable[[], int] = lambda: ceiling
        self._readings: Readings | None = None
        self._subscribers: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None
        #: the value the subscribers last heard of
        self._announced: int | None = None
        self.law = Law(knobs, ceiling=lambda: self._ceiling(), in_use=self._in_use)

    # -- what the gateway calls -------------------------------------------------------------

    def max_in_flight(self) -> int:
        return self.law.limit()

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)
        self._announced = self.law.limit()  # what the subscriber has just read

    def use_ceiling(self, ceiling: Callable[[], int]) -> None:
        self._ceiling = ceiling

    def use_readings(self, readings: Readings) -> None:
        self._readings = readings
        if not self._own_clock:
            self._clock = readings.clock

    def first_byte(self, seconds: float) -> None:
        """One admitted request's time to first byte (the gateway's first-byte feed)."""
        was_probing = self.law.probing
        self.law.sample(seconds, self._clock())
        self._after(was_probing)

    def longest_gap(self, seconds: float, lasted: float) -> None:
        """A stream's longest wait between two tokens so far, and the time from its
        hand-over to the token that ended that wait (the gateway's latency feed)."""
        was_probing = self.law.probing
        self.law.stall(seconds, lasted, self._clock())
        self._after(was_probing)

    async def stop(self) -> None:
        """Cancel a probe's pending time-out: the gateway is stopping."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- inside -----------------------------------------------------------------------------

    def expire(self) -> None:
        """End a probe whose time is up (its timer calls this, on the event loop)."""
        self._timer = None
        was_probing = self.law.probing
        self.law.expire(self._clock())
        if self.law.probing:  # woken a hair early: wait again
            self._time_probe()
        self._after(was_probing)

    def _after(self, was_probing: bool) -> None:
        """Log a probe's start or end, time a new probe, and announce a new value. The
        value is compared with the one last announced, not the one before the sample: a
        ceiling lowered in between may have changed it unannounced (harmless, the lower
        ceiling rules), and the subscribers must hear of it before the ceiling rises."""
        law = self.law
        if law.probing != was_probing:
            log.info("adaptive: %s", law.reason)
            if law.probing:
                self._time_probe()
            elif self._timer is not None:  # the probe ended before its time
                self._timer.cancel()
                self._timer = None
        value = law.limit()
        if value != self._announced:
            log.debug("adaptive limit %s -> %d (%s)", self._announced, value, law.reason)
            self._announced = value
            for callback in self._subscribers:
                callback()

    def _time_probe(self) -> None:
        """Wake up when the probe under way must give up: once the limit is low, no
        request may get a first byte to bring the law back (all those in flight may be
        past theirs), so the probe cannot count on a sample to end it."""
        deadline = self.law.probe_deadline
        if deadline is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # fed outside an event loop (a test): expire() is called
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(max(0.0, deadline - self._clock()), self.expire)

    def _in_use(self, limit: int) -> bool:
        """Whether the upstreams serve at least ``use`` of ``limit`` (running and waiting
        requests, over those with a fresh, healthy reading). Without upstreams there is
        nothing to read, and the limit counts as in use: the ceiling bounds its growth."""
        readings = self._readings
        if readings is None or len(readings) == 0:
            return True
        serving = 0.0
        fresh = False
        for url in readings:
            reading = readings.get(url)
            if not reading.healthy or readings.stale(url):
                continue
            fresh = True
            serving += (reading.running or 0.0) + (reading.waiting or 0.0)
        return fresh and serving >= self.law.knobs.use * limit

    def explain(self) -> dict[str, object]:
        """The limit, the last decision and what it was taken on, for operators."""
        law = self.law
        return {
            "limit": law.limit(),
            "reason": law.reason,
            "probing": law.probing,
            "baseline_s": law.baseline,
            "window_s": law.short,
        }
