"""The adaptive law's parameters, one dataclass: what ``OBLETH_ADAPTIVE_*`` sets (the
plugin reads them, the README explains each)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Knobs:
    """The law's parameters (``OBLETH_ADAPTIVE_*``; the README explains each)."""

    floor: int = 1
    """The lowest limit the law sets."""
    initial: int | None = None
    """The limit after the first probe; None for a slow start from ``probe_limit`` (or
    ``floor``, if higher)."""
    tolerance: float = 4.0
    """How many times the no-load time to first byte a window may take before the limit
    shrinks."""
    stall_within: float = 10.0
    """How many times the no-load time to first byte a stream may wait between two tokens
    before the wait counts as a stall, and the limit is cut; 0: stalls are ignored."""
    grow_within: float | None = None
    """How many times the no-load time a window may take at most for the limit to grow;
    between this and ``tolerance`` the limit holds. None: ``tolerance`` (no band where it
    holds)."""
    window: int = 10
    """Samples per decision (fewer while the limit is lower, see ``MIN_WINDOW``); the
    window's median is its time to first byte."""
    use: float = 0.8
    """The share of the limit the backends must be serving for it to count as in use."""
    probe_every: int = 30
    """A probe comes after this many times the limit in samples (the limit as it is when
    each sample comes); 0: no periodic probe."""
    probe_limit: int = 3
    """The limit while probing (never more than the limit before the probe)."""
    probe_samples: int = 5
    """Samples a probe measures; their median becomes the no-load time to first byte."""
    probe_timeout_s: float = 10.0
    """A probe that has not measured its samples in this time ends with those it has."""
