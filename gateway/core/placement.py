"""Where new prefixes went: bounded-load rendezvous placement and its shared record.

A prompt whose first block no upstream holds is *placed*. Pure rendezvous hashing sends
it to the same upstream from every pod without coordination, but with few large prefixes
it is lopsided: sixteen system prompts hashed onto four upstreams put seven on one about
a time in three, and that upstream's prefix cache thrashes while the others idle. So the
placement keeps to the upstreams not ahead of the others by more than a bound in prompt
content already placed on them (consistent hashing with bounded loads). A new prefix
misses the cache wherever it goes, so among those where it goes is a load decision: within
one request of the fewest in flight, the upstream sent a request longest ago, ties going
by the prefix's rendezvous order.

A bounded choice depends on the moment it is made, so two pods could place the same
prefix differently. The record of placements (``PlacementLog``) is what keeps them in
agreement: a pod looks a prefix up there before placing it, and in cluster mode every
pod's placements reach every other pod within one synchronisation interval, the first
one written winning.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gateway.core.rendezvous import weight

KEPT = 8192
"""How many placements a router remembers (and, in cluster mode, the shared record keeps)."""


class Placed(NamedTuple):
    """One placement: the upstream a prefix went to, and the prompt's size in blocks."""

    upstream: str
    blocks: int
    confirmed: bool
    """True once the cluster's shared record holds it (always, in one process)."""
    mine: bool = True
    """False for a placement another pod made, learnt from the shared record."""


class PlacementLog:
    """The placements this pod knows, bounded, oldest forgotten first; see the module.

    What callers may rely on:

    - ``get(key)`` is the upstream the prefix with first-block hash ``key`` was placed on;
      ``placed_by_another(key)`` the same when another pod placed it.
    - ``record`` keeps the first placement of a key; later ones are ignored.
    - ``learn`` applies the shared record, in its order: the first entry for a key wins
      over this pod's own unconfirmed placement of it and over every later entry.
    - ``blocks(upstream)`` is the prompt content (blocks) placed on the upstream among the
      placements kept; at most ``capacity`` placements are kept.
    - With ``shared`` set, own placements wait in ``unshared()`` for the synchroniser; at
      most ``capacity`` of them, the oldest dropped first (the shared record keeps no more
      either), so a pod that cannot reach Redis for hours holds no more than that.
    """

    __slots__ = ("_blocks", "_capacity", "_dropped", "_shared", "_unshared", "_where")

    def __init__(self, capacity: int, *, shared: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._shared = shared
        self._where: OrderedDict[int, Placed] = OrderedDict()
        self._blocks: dict[str, int] = {}
        self._unshared: deque[tuple[int, str, int]] = deque()
        #: unshared placements dropped for the bound since the synchroniser last read them
        self._dropped = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._where)

    def get(self, key: int) -> str | None:
        placed = self._where.get(key)
        return None if placed is None else placed.upstream

    def placed_by_another(self, key: int) -> str | None:
        """Where another pod placed ``key``; None when no pod did, or this one did."""
        placed = self._where.get(key)
        return None if placed is None or placed.mine else placed.upstream

    def blocks(self, upstream: str) -> int:
        return self._blocks.get(upstream, 0)

    def record(self, key: int, upstream: str, blocks: int) -> None:
        """This pod placed ``key`` on ``upstream``; kept unless ``key`` is placed already."""
        if key in self._where:
            return
        self._put(key, Placed(upstream, blocks, not self._shared))
        if self._shared:
            unshared = self._unshared
            unshared.append((key, upstream, blocks))
            if len(unshared) > self._capacity:
                unshared.popleft()
                self._dropped += 1

    def learn(self, key: int, upstream: str, blocks: int) -> None:
        """The shared record says ``key`` went to ``upstream`` (entries in record order)."""
        known = self._where.get(key)
        if known is not None:
            if known.confirmed:
                return
            self._drop(key)
        mine = known is not None and known.upstream == upstream
        self._put(key, Placed(upstream, blocks, True, mine))

    def unshared(self, limit: int) -> list[tuple[int, str, int]]:
        """Up to ``limit`` own placements not yet in the shared record, oldest first;
        they stay here until ``shared(n)`` says the first ``n`` were written."""
        self._dropped = 0
        return list(itertools.islice(self._unshared, limit))

    def shared(self, count: int) -> None:
        """The first ``count`` placements ``unshared`` gave were written (those dropped for
        the bound since then are gone already)."""
        for _ in range(min(count - self._dropped, len(self._unshared))):
            self._unshared.popleft()
        self._dropped = 0

    def _put(self, key: int, placed: Placed) -> None:
        self._where[key] = placed
        self._blocks[placed.upstream] = self._blocks.get(placed.upstream, 0) + placed.blocks
        while len(self._where) > self._capacity:
            self._drop(next(iter(self._where)))

    def _drop(self, key: int) -> None:
        placed = self._where.pop(key)
        left = self._blocks[placed.upstream] - placed.blocks
        if left:
            self._blocks[placed.upstream] = left
        else:
            del self._blocks[placed.upstream]


def place(
    key: int,
    candidates: Sequence[tuple[str, int]],
    *,
    bound: float,
    blocks: Callable[[str], int],
    in_flight: Callable[[str], int],
    last_sent: Callable[[str], int],
) -> str | None:
    """The upstream for a new prefix, of ``candidates`` (``(name, salt)``); None when
    there are none. Of those within ``bound`` times the average of ``blocks`` placed, and
    within one request of the fewest ``in_flight`` among them, the one sent a request
    longest ago (``last_sent``: a number that grows with every request sent, 0 for
    never), ties going to the earliest in the rendezvous order of ``key``.

    A new prefix misses the prefix cache wherever it goes, so its placement is a load
    decision, and its time to first token waits mostly on the prefills just ahead of it:
    requests sent to the same upstream a moment before. In-flight counts, exact when
    choosing, are dominated by requests decoding, which delay a new one little: taking
    the fewest in flight alone put arrivals close together on one upstream, and
    prefix-free traffic saw 1.5 times round-robin's TTFT p99 (a random pick within 1.25
    times the average, this rule's first form: 2.4 times; docs/benchmarks.md, "Routing
    quality"). So requests are spaced out as round-robin spaces them, among upstreams
    within one request of the fewest in flight, which keeps the choice load-aware when an
    upstream slows down. The rendezvous order decides among equals, so idle pods agree;
    the placement record keeps pods in agreement for prefixes that recur. The content
    bound keeps a few large prefixes from crowding one cache. ``bound`` 0 is pure
    rendezvous, the same on every pod without sharing anything. With ``bound`` at least 1
    some candidate always qualifies on content (the least is never above the average).
    """
    if not candidates:
        return None
    order = sorted(candidates, key=lambda c: (-weight(key, c[1]), c[0]))
    if bound <= 0 or len(order) == 1:
        return order[0][0]
    names = [name for name, _ in order]
    held = [blocks(u) for u in names]
    held_cap = bound * sum(held) / len(names)
    fits = [u for u, h in zip(names, held, strict=True) if h <= held_cap] or names[:1]
    counts = [in_flight(u) for u in fits]
    most = min(counts) + 1
    eligible = [u for u, n in zip(fits, counts, strict=True) if n <= most]
    return min(eligible, key=last_sent)  # min keeps the first of equals: rendezvous order
