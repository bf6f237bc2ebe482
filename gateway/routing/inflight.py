"""Our own requests in flight per upstream: counted when one is chosen, not when scraped.

Scraped metrics lag by up to a polling interval; a burst routed on them alone lands on one
upstream. So the router counts a request against its upstream the moment it chooses it,
and gives the count back when the request ends, on every path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


class InFlight:
    """Requests this gateway has sent to each upstream and not finished.

    ``count(u)`` is what routing decisions read: this pod's own count, plus (in cluster
    mode, see ``gateway.routing.sharing``) the other pods' as last synchronised.
    ``add``/``remove`` are called exactly once each per routed request (the router's
    ``Decision`` guarantees it); a count never goes below zero.
    """

    def __init__(self, upstreams: Iterable[str]) -> None:
        self._local: dict[str, int] = dict.fromkeys(upstreams, 0)
        # kept equal to local + others at every change, so reading a count is one lookup
        self._totals: dict[str, int] = dict(self._local)
        self.count: Callable[[str], int] = self._totals.__getitem__
        """Our requests in flight on an upstream (all pods'); KeyError for an unknown one."""

    def add(self, upstream: str) -> None:
        self._local[upstream] += 1
        self._totals[upstream] += 1

    def remove(self, upstream: str) -> None:
        if self._local[upstream] > 0:
            self._local[upstream] -= 1
            self._totals[upstream] -= 1

    def busy(self) -> bool:
        """Whether any request is in flight on any upstream (all pods')."""
        return any(self._totals.values())

    def totals(self) -> Mapping[str, int]:
        """Every upstream's count, all pods included (a live view: do not change it)."""
        return self._totals

    def local(self) -> Mapping[str, int]:
        """This pod's own counts (a live view)."""
        return self._local

    def set_others(self, counts: Mapping[str, int]) -> None:
        """Replace the other pods' counts (the cluster synchroniser's job)."""
        for upstream, local in self._local.items():
            self._totals[upstream] = local + max(0, counts.get(upstream, 0))
