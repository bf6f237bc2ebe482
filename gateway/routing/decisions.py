"""What the router decided lately, for operators: how many requests went to each upstream,
and the last few choices with the scores behind them (``/api/v1/status``, the metrics)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

#: how many recent choices are kept
RECENT_KEPT = 20

ROUTED = "routed"  # chosen for a new request
REROUTED = "rerouted"  # chosen after another upstream failed the request


class DecisionLog:
    """Counts per upstream and kind (``routed``, ``rerouted``), and the ``RECENT_KEPT`` latest
    choices. Written by the router on the event loop, read from memory by anyone;
    ``counts`` and ``recent`` copy."""

    __slots__ = ("_counts", "_recent")

    def __init__(self, upstreams: Iterable[str]) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        for upstream in upstreams:
            self._counts[(upstream, ROUTED)] = 0
            self._counts[(upstream, REROUTED)] = 0
        self._recent: deque[tuple[float, str, str, Mapping[str, Mapping[str, float]]]] = deque(
            maxlen=RECENT_KEPT
        )

    def chose(self, upstream: str, kind: str, scores: Mapping[str, Mapping[str, float]]) -> None:
        """``upstream`` was chosen (``kind``); ``scores`` are the decision's own, kept as
        they are (the router never changes them afterwards)."""
        self._counts[(upstream, kind)] += 1
        self._recent.append((time.time(), upstream, kind, scores))

    def counts(self) -> Mapping[tuple[str, str], int]:
        return self._counts.copy()

    def recent(self) -> list[dict[str, Any]]:
        """The latest choices, newest first: when (Unix time), where, and why (each
        scorer's score of the upstream chosen)."""
        return [
            {
                "at": round(at, 3),
                "upstream": upstream,
                "kind": kind,
                "scores": {
                    scorer: round(by_upstream[upstream], 4)
                    for scorer, by_upstream in scores.items()
                    if upstream in by_upstream
                },
            }
            for at, upstream, kind, scores in reversed(self._recent.copy())
        ]
