"""The ``kv-utilization`` scorer: prefer the upstream with the most free KV cache."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings


class KvUtilization:
    """Score = ``1 - kv``, ``kv`` the scraped KV-cache usage fraction
    (``vllm:kv_cache_usage_perc``, or ``vllm:gpu_cache_usage_perc`` on older vLLM).

    An upstream that exports no KV usage scores 0. The number is only as fresh as the
    last scrape: weigh it together with ``queue-depth``, which also counts our own
    requests sent since.
    """

    def __init__(self, settings: Settings) -> None:
        pass

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        fleet = request.fleet
        scores = {}
        for upstream in upstreams:
            kv = fleet.reading(upstream).kv_usage
            scores[upstream] = 0.0 if kv is None else 1.0 - kv
        return scores


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"kv-utilization": KvUtilization}
