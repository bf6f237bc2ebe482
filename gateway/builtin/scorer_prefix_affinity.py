"""The ``prefix-affinity`` scorer: send a prompt where its leading blocks were sent before."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.prefixindex import PrefixIndex
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings

PLACEMENT_BOUND = 1.25
"""A new prefix skips an upstream holding more than this multiple of the average blocks."""


class PrefixAffinity:
    """Score = consecutive leading blocks of the prompt this pod recently sent to the
    upstream / the prompt's blocks (0 for a prompt shorter than one block).

    The memory of what went where is an LRU of ``prefix_index_blocks`` block hashes per
    upstream, updated when a request is dispatched (``dispatched``). A prompt whose first
    block no candidate holds is new: it scores 1 on the upstream that rendezvous hashing of
    its first block assigns, so every gateway pod places a new prefix on the same upstream
    without talking to the others; an upstream already holding more than 1.25 times the
    average of the blocks sent is skipped for the next in rendezvous order, so that no
    server's cache collects far more prefixes than the others'. Weigh it against a load
    scorer (``queue-depth``): alone it would pile a popular prefix onto one upstream.
    """

    def __init__(self, settings: Settings) -> None:
        self.index = PrefixIndex(settings.prefix_index_blocks)

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        blocks = request.blocks
        if not blocks:
            return {}
        total = len(blocks)
        matched = self.index.matched(blocks)
        scores = {u: matched[u] / total for u in upstreams if u in matched}
        if scores:
            return scores
        return {self._place(blocks[0], request, upstreams): 1.0} if upstreams else {}

    def _place(self, first_block: int, request: RouteRequest, upstreams: list[str]) -> str:
        """Where a new prefix goes: its rendezvous upstream, unless that one already holds
        far more of what this pod sent than the others (its cache is the fullest), then the
        next in rendezvous order. Pods that see similar traffic agree."""
        held = {u: self.index.held(u) for u in upstreams}
        bound = PLACEMENT_BOUND * (sum(held.values()) + 1) / len(upstreams)
        order = request.fleet.rendezvous_order(first_block, upstreams)
        return next((u for u in order if held[u] <= bound), order[0])

    def dispatched(self, request: RouteRequest, upstream: str) -> None:
        if request.blocks:
            self.index.record(upstream, request.blocks)


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"prefix-affinity": PrefixAffinity}
