"""``KvPressureLimit``: the ``kv-pressure`` capacity provider, the law wired to the
gateway: it reads the readings the gateway's poller already takes, decides once per
polling round, and tells the gateway when its value changes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway import Readings

from obleth_kv_pressure.law import Decision, Knobs, Law, Signals

log = logging.getLogger("obleth.kv_pressure")


class KvPressureLimit:
    """The limit the backends' KV cache can hold, found by the law of ``law.py``.

    What the gateway may rely on: ``max_in_flight()`` answers from memory; the value
    changes only after a polling round, and every change is announced to the
    ``subscribe``d callbacks; it never exceeds the operator's limit (``use_ceiling``).
    ``explain()`` says what the last round decided and why.

    Before the first round the limit is ``initial`` (default: the operator's limit), so
    that installing the provider changes nothing until the backends show pressure.
    """

    def __init__(self, knobs: Knobs, initial: int | None = None) -> None:
        self.law = Law(knobs)
        self._initial = initial
        self._limit: int | None = initial
        self._cooling = 0
        self._ceiling: Callable[[], int] = lambda: initial or knobs.floor
        self._readings: Readings | None = None
        self._preemptions: dict[str, float] = {}
        self._subscribers: list[Callable[[], None]] = []
        self.last: Decision | None = None
        self.last_signals: Signals | None = None

    # -- what the gateway calls -----------------------------------------------------------

    def max_in_flight(self) -> int:
        # never above the ceiling, however it moved since the last round (read when the
        # provider announces a change and for the status, not per request)
        ceiling = self._ceiling()
        limit = self._limit
        return ceiling if limit is None else min(limit, ceiling)

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)

    def use_ceiling(self, ceiling: Callable[[], int]) -> None:
        self._ceiling = ceiling

    def use_readings(self, readings: Readings) -> None:
        self._readings = readings
        readings.subscribe(self.round)

    # -- one polling round ----------------------------------------------------------------

    def round(self) -> None:
        """Decide after a polling round (the readings call it); announce a change."""
        readings = self._readings
        if readings is None:
            return
        if self._ceiling() == 0:
            # admissions are paused: nothing runs, so nothing is learnt, and the limit of
            # before the pause is there again when the operator raises the ceiling
            return
        signals = self.signals(readings)
        before = self.max_in_flight()
        decision = self.law.next(before, self._ceiling(), signals, self._cooling)
        self._cooling = decision.cooling
        self.last, self.last_signals = decision, signals
        if decision.limit != before:
            # a cut or a rise; a hold keeps the limit learnt, which the ceiling only caps
            # (the gateway takes the lower of the two): an operator who lowers the ceiling
            # for a while and raises it again finds it
            log.info("kv-pressure limit %d -> %d (%s)", before, decision.limit, decision.reason)
            self._limit = decision.limit
            for callback in self._subscribers:
                callback()

    def signals(self, readings: Readings, now: float | None = None) -> Signals:
        """The round's signals over the upstreams with fresh readings. Preemptions count
        the rise of each upstream's counter since the round before (a counter that went
        down was reset: the upstream restarted, and its new count is all new)."""
        when = readings.clock() if now is None else now
        fresh = 0
        kv: float | None = None
        preempted = queued = serving = 0.0
        for url in readings:
            reading = readings.get(url)
            if not reading.healthy or readings.stale(url, when):
                continue
            fresh += 1
            if reading.kv_usage is not None:
                kv = reading.kv_usage if kv is None else max(kv, reading.kv_usage)
            if reading.preemptions is not None:
                seen = self._preemptions.get(url)
                if seen is not None:
                    rise = reading.preemptions - seen
                    preempted += rise if rise >= 0 else reading.preemptions
                self._preemptions[url] = reading.preemptions
            queued += readings.queued(url)
            serving += (reading.running or 0.0) + (reading.waiting or 0.0)
        return Signals(fresh, kv, preempted, queued, serving)

    def explain(self) -> dict[str, object]:
        """The last round's decision and the signals it was taken on, for operators."""
        signals = self.last_signals
        return {
            "limit": self.max_in_flight(),
            "reason": None if self.last is None else self.last.reason,
            "signals": None
            if signals is None
            else {
                "fresh_upstreams": signals.fresh,
                "kv_usage": signals.kv_usage,
                "preemptions": signals.preemptions,
                "queued": signals.queued,
                "serving": signals.serving,
            },
        }
