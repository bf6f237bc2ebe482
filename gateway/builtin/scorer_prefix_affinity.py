"""The ``prefix-affinity`` scorer: send a prompt where its leading blocks were sent before."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.prefixindex import PrefixIndex
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings


class PrefixAffinity:
    """Score = consecutive leading blocks of the prompt this pod recently sent to the
    upstream / the prompt's blocks (0 for a prompt shorter than one block).

    The memory of what went where is an LRU of ``prefix_index_blocks`` block hashes per
    upstream, updated when a request is dispatched (``dispatched``). A prompt whose first
    block no candidate holds is new: it scores 1 on the upstream ``Fleet.place`` chooses
    (rendezvous hashing of its first block, bounded by load; where another pod placed it,
    in cluster mode), so pods send a new prefix to the same upstream. Weigh it against a
    load scorer (``queue-depth``): alone it would pile a popular prefix onto one upstream.
    """

    def __init__(self, settings: Settings) -> None:
        self.index = PrefixIndex(settings.prefix_index_blocks)

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        blocks = request.blocks
        if not blocks:
            return {}
        total = len(blocks)
        matched = self.index.matched(blocks)
        fleet = request.fleet
        home = fleet.placements.placed_by_another(blocks[0])
        if home is not None and home not in matched and home in upstreams:
            # another pod placed this prefix first, while this one sent it elsewhere: from
            # now on it goes where the others send it (a placement of this pod's own is no
            # reason to leave the upstream that holds the prefix now)
            self.index.drop(blocks[0])
            return {home: 1.0}
        scores = {u: matched[u] / total for u in upstreams if u in matched}
        if scores:
            return scores
        placed = fleet.place(blocks[0], upstreams)
        return {} if placed is None else {placed: 1.0}

    def dispatched(self, request: RouteRequest, upstream: str) -> None:
        blocks = request.blocks
        if blocks:
            self.index.record(upstream, blocks)
            request.fleet.placed(blocks[0], upstream, len(blocks))


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"prefix-affinity": PrefixAffinity}
