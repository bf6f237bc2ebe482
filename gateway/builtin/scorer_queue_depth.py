"""The ``queue-depth`` scorer: prefer the upstream with the shortest queue."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings


class QueueDepth:
    """Score = ``(maxQ - q) / (maxQ - minQ)`` over the candidates, 1 for all when equal.

    ``q`` is the upstream's waiting requests as last scraped
    (``vllm:num_requests_waiting``) plus the requests this gateway sent it and has not
    finished, counted at decision time, so a burst between two scrapes spreads out.
    """

    def __init__(self, settings: Settings) -> None:
        pass

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        fleet = request.fleet
        depth = {u: (fleet.reading(u).waiting or 0.0) + fleet.in_flight(u) for u in upstreams}
        if not depth:
            return {}
        low, high = min(depth.values()), max(depth.values())
        if high == low:
            return dict.fromkeys(depth, 1.0)
        span = high - low
        return {u: (high - q) / span for u, q in depth.items()}


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"queue-depth": QueueDepth}
