"""RecentShare: what share of the latest requests each prefix had, over a bounded window.

A prefix that alone brings more than one upstream's fair share of the traffic cannot stay
on one upstream without that upstream carrying more than the others: every request with
a shared system prompt is the extreme case, where keeping the prefix where it is cached
sends the whole load to one server (vLLM production-stack's issue #957). Counting each
prefix's share of recent requests says how many upstreams it needs.
"""

from __future__ import annotations

import math
from collections import Counter, deque


class RecentShare:
    """Counts of the keys of the last ``window`` requests.

    What callers may rely on:

    - ``seen(key)`` counts one request of ``key``; the oldest of more than ``window``
      requests stops counting, so memory is bounded by ``window`` keys.
    - ``share(key)`` is the key's count over the requests counted, but never over fewer
      than a quarter of ``window``: a prefix has to bring enough requests to count as
      popular, so the first few requests a router sees make no prefix look like all of
      its traffic, while a router that sees a third of the traffic (one pod of three)
      still finds a prefix every request shares popular within a quarter window.
    - ``upstreams_needed(key, upstreams)`` is how many of ``upstreams`` the key's traffic
      fills at a fair share each: ``ceil(share * upstreams)``, at least 1.
    """

    __slots__ = ("_counts", "_window", "_window_size")

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._window: deque[int] = deque()
        self._counts: Counter[int] = Counter()
        self._window_size = window

    def seen(self, key: int) -> None:
        window = self._window
        window.append(key)
        self._counts[key] += 1
        if len(window) > self._window_size:
            old = window.popleft()
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]

    def __len__(self) -> int:
        """The distinct keys counted (at most ``window``)."""
        return len(self._counts)

    def share(self, key: int) -> float:
        counted = max(len(self._window), self._window_size // 4, 1)
        return self._counts.get(key, 0) / counted

    def upstreams_needed(self, key: int, upstreams: int) -> int:
        # a share of exactly 1/upstreams fits one: the tiny tolerance keeps float error
        # (3 of 12 is 0.25000000000000006 times 4 in some orders) from asking for two
        return max(1, math.ceil(self.share(key) * upstreams - 1e-9))
