"""The ``load-balance`` scorer: prefer the upstream with the least work of any kind."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings


class LoadBalance:
    """Score = ``1 / (1 + waiting + running + ours)``: scraped waiting and running
    requests plus the requests this gateway sent and has not finished."""

    def __init__(self, settings: Settings) -> None:
        pass

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        fleet = request.fleet
        scores = {}
        for upstream in upstreams:
            reading = fleet.reading(upstream)
            load = (reading.waiting or 0.0) + (reading.running or 0.0) + fleet.in_flight(upstream)
            scores[upstream] = 1.0 / (1.0 + load)
        return scores


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"load-balance": LoadBalance}
