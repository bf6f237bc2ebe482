"""The control law, on its own: what the next limit is, given the last one and what the
backends showed in one polling round. Pure and deterministic, so that it can be tested
and explained without a gateway or a clock."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Knobs:
    """The law's parameters (``OBLETH_KV_PRESSURE_*``; see the README)."""

    high: float = 0.92
    """KV usage at or above which a backend is under pressure."""
    low: float = 0.80
    """KV usage under which a backend has room to take more."""
    decrease: float = 0.7
    """The factor a limit is multiplied by under pressure."""
    cooldown_rounds: int = 2
    """Polling rounds to hold after a decrease before deciding again: the readings of
    the round after a cut still show the load from before it."""
    floor: int = 1
    """The lowest limit the law sets."""
    use: float = 0.9
    """The share of the limit the backends must be serving for it to count as in use;
    a limit nobody reaches is not raised."""


@dataclass(frozen=True, slots=True)
class Signals:
    """What one polling round showed, over the backends with fresh readings."""

    fresh: int
    """Backends whose readings are fresh; with none, the law holds."""
    kv_usage: float | None
    """The fullest backend's KV usage (0..1), None when no backend exports it."""
    preemptions: float
    """Sequences preempted across the backends since the previous round."""
    queued: float
    """Requests the backends kept waiting across their last two scrapes."""
    serving: float
    """Requests the backends hold, running and waiting."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The law's answer for one round: the new limit and why, for the status page."""

    limit: int
    reason: str
    cooling: int
    """Rounds left before the law may cut again."""


class Law:
    """Additive increase, multiplicative decrease, on KV signals.

    - **Pressure** (any preemption since the last round, or the fullest backend at or
      above ``high`` KV usage): the limit is multiplied by ``decrease``, and not cut again
      for ``cooldown_rounds`` rounds, so that the cut can show in the readings.
    - **Room** (every fresh backend under ``low`` KV usage, none keeping requests waiting,
      and the backends serving at least ``use`` of the limit: the limit is what holds the
      load back): the limit grows by one, or by a twentieth of itself when that is more.
    - Otherwise, and whenever no backend has a fresh reading, it holds.

    The result always lies between ``floor`` and ``ceiling`` (the operator's limit), and
    the ceiling wins over a floor set above it.
    """

    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs

    def next(self, limit: int, ceiling: int, signals: Signals, cooling: int) -> Decision:
        knobs = self.knobs
        floor = min(knobs.floor, ceiling)  # the operator's limit wins over the floor
        limit = min(max(limit, floor), ceiling)
        if signals.fresh == 0:
            return Decision(limit, "hold: no fresh reading from any backend", cooling)
        kv = signals.kv_usage
        pressed = signals.preemptions > 0 or (kv is not None and kv >= knobs.high)
        if pressed:
            why = (
                f"{signals.preemptions:g} preemptions"
                if signals.preemptions > 0
                else f"KV usage {kv:.2f} >= {knobs.high:g}"
            )
            if cooling > 0:
                return Decision(limit, f"hold: {why}, cooling down", cooling - 1)
            cut = max(floor, math.floor(limit * knobs.decrease))
            return Decision(cut, f"decrease: {why}", knobs.cooldown_rounds)
        cooling = max(0, cooling - 1)
        roomy = kv is None or kv < knobs.low
        in_use = signals.serving >= knobs.use * limit
        if not in_use:
            return Decision(limit, "hold: the limit is not in use", cooling)
        if signals.queued > 0:
            return Decision(limit, "hold: backends keep requests waiting", cooling)
        if not roomy:
            return Decision(limit, f"hold: KV usage {kv:.2f} between the marks", cooling)
        if limit >= ceiling:
            return Decision(limit, "hold: at the operator's limit", cooling)
        grown = min(ceiling, limit + max(1, limit // 20))
        return Decision(grown, "increase: backends have room and the limit is in use", cooling)
