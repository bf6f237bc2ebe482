"""The ``prefix-affinity`` scorer: send a prompt where its leading blocks were sent before."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.popularity import RecentShare
from gateway.core.prefixindex import PrefixIndex
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings

RECENT_PER_UPSTREAM = 32
"""The window of recent requests that prefix popularity is counted over, per upstream: a
prefix needs more than this many of the window's requests per upstream it holds before it
is given one more (few enough that a shared system prompt spreads within seconds, enough
that sixteen prompts chosen at random never look popular by chance)."""


class PrefixAffinity:
    """Score = consecutive leading blocks of the prompt this pod recently sent to the
    upstream / the prompt's blocks (0 for a prompt shorter than one block).

    The memory of what went where is an LRU of ``prefix_index_blocks`` block hashes per
    upstream, updated when a request is dispatched (``dispatched``). A prompt whose first
    block no candidate holds is new: it misses every cache alike, and it scores 1 on the
    upstream ``Fleet.place`` chooses by load (bounded in content placed, near the fewest
    in flight, the longest since a request was sent there, ties by the rendezvous order
    of its first block; where another pod placed it, in cluster mode). Weigh it against a
    load scorer (``queue-depth``): alone it would pile a popular prefix onto one upstream.

    A prefix popular enough to fill more than one upstream's fair share of the recent
    requests (a system prompt every request shares) gets more holders: while fewer
    candidates hold it than ``RecentShare.upstreams_needed`` says and each holder has more
    requests in flight than some other candidate, one more, chosen by ``Fleet.place``
    among the others, scores as high as the best holder. Load then decides
    between them, and the prefix spreads at one cold prefill per new holder, rather than
    staying on one upstream until the load guard sees a queue there.
    """

    def __init__(self, settings: Settings) -> None:
        self.index = PrefixIndex(settings.prefix_index_blocks)
        self.recent = RecentShare(RECENT_PER_UPSTREAM * max(1, len(settings.upstreams)))

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
        if not scores:
            placed = fleet.place(blocks[0], upstreams)
            return {} if placed is None else {placed: 1.0}
        if len(scores) < min(
            len(upstreams), self.recent.upstreams_needed(blocks[0], len(upstreams))
        ):
            others = [u for u in upstreams if u not in scores]
            count = fleet.in_flight
            # only while every holder is busier than some other upstream: otherwise the
            # holders keep up, and placing a spare (a sort over the candidates) for every
            # request would cost more than it could bring
            if min(count(u) for u in scores) > min(count(u) for u in others):
                spare = fleet.place(blocks[0], others)
                if spare is not None:
                    scores[spare] = max(scores.values())
        return scores

    def dispatched(self, request: RouteRequest, upstream: str) -> None:
        blocks = request.blocks
        if blocks:
            self.recent.seen(blocks[0])
            self.index.record(upstream, blocks)
            request.fleet.placed(blocks[0], upstream, len(blocks))


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"prefix-affinity": PrefixAffinity}
