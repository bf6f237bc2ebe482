"""Fleet: the upstreams as a routing decision sees them, read from memory."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.core import rendezvous
from gateway.routing.inflight import InFlight
from gateway.routing.readings import Reading, Readings


class Fleet:
    """Readings, our in-flight counts and rendezvous hashing, for scorers.

    Scorers get it as ``request.fleet``. Everything answers from memory at once.
    """

    __slots__ = ("_salts", "in_flight", "inflight", "reading", "readings")

    def __init__(self, readings: Readings, inflight: InFlight) -> None:
        self.readings = readings
        self.inflight = inflight
        self._salts = {url: rendezvous.stable_hash(url) for url in readings}
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
