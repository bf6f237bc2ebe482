"""Fleet: the upstreams as a routing decision sees them, read from memory."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from gateway.core import placement, rendezvous
from gateway.core.placement import KEPT, PlacementLog
from gateway.routing.inflight import InFlight
from gateway.routing.readings import Reading, Readings


class Fleet:
    """Readings, our in-flight counts, rendezvous hashing and prefix placement, for scorers.

    Scorers get it as ``request.fleet``. Everything answers from memory at once.
    """

    __slots__ = (
        "_last_sent",
        "_salts",
        "_sends",
        "in_flight",
        "inflight",
        "placement_bound",
        "placements",
        "reading",
        "readings",
    )

    def __init__(
        self,
        readings: Readings,
        inflight: InFlight,
        placements: PlacementLog | None = None,
        *,
        placement_bound: float = 0.0,
    ) -> None:
        self.readings = readings
        self.inflight = inflight
        self.placements = placements if placements is not None else PlacementLog(KEPT)
        """Where new prefixes went (every pod's, in cluster mode)."""
        self.placement_bound = placement_bound
        self._salts = {url: rendezvous.stable_hash(url) for url in readings}
        self._sends = 0
        self._last_sent: dict[str, int] = {}
        # bound lookups rather than methods: scorers call them for every upstream
        self.reading: Callable[[str], Reading] = readings.get
        """``reading(upstream)``: the latest scrape of the upstream."""
        self.in_flight: Callable[[str], int] = inflight.count
        """``in_flight(upstream)``: requests we sent there and have not finished (every
        pod's, in cluster mode)."""

    def rendezvous(self, key: int, candidates: Iterable[str]) -> str | None:
        """The candidate rendezvous hashing assigns ``key`` to: the same on every pod."""
        salts = self._salts
        return rendezvous.pick(key, ((u, salts[u]) for u in candidates))

    def place(self, key: int, candidates: Collection[str]) -> str | None:
        """The candidate for a prefix that no candidate holds, ``key`` its first block.

        Where it was placed before, by this pod or (in cluster mode) any other, when that
        upstream is a candidate; otherwise, of the candidates not ahead of the others by
        more than ``routing_placement_bound`` in prompt content placed on them and within
        one request of the fewest in flight, the one this pod sent a request to longest
        ago, ties in the rendezvous order of ``key`` (see ``gateway.core.placement``).
        With the bound at 0, plain rendezvous hashing.
        """
        known = self.placements.get(key)
        if known is not None and known in candidates:
            return known
        salts = self._salts
        return placement.place(
            key,
            [(u, salts[u]) for u in candidates],
            bound=self.placement_bound,
            blocks=self.placements.blocks,
            in_flight=self.in_flight,
            last_sent=self._last_sent_to,
        )

    def _last_sent_to(self, upstream: str) -> int:
        return self._last_sent.get(upstream, 0)

    def placed(self, key: int, upstream: str, blocks: int) -> None:
        """A request whose prompt starts with block ``key`` (``blocks`` long) was sent to
        ``upstream``; the first such call for a key is its placement. It is also the
        latest request sent there, which placements use to space requests out."""
        self.placements.record(key, upstream, blocks)
        self._sends += 1
        self._last_sent[upstream] = self._sends
