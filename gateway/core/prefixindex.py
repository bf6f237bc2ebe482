"""PrefixIndex: which prompt blocks the router recently sent to each upstream, bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class PrefixIndex:
    """An LRU of block hashes per upstream, and which upstreams hold each block.

    What callers may rely on:

    - ``record(upstream, blocks)`` marks every block as held by ``upstream``, the first
      block the most recently used, so under pressure a prompt's tail is forgotten before
      its head (as a server's prefix cache does).
    - No upstream ever holds more than ``capacity_blocks`` blocks; memory is bounded by
      ``capacity_blocks`` times the number of upstreams recorded.
    - ``matched(blocks)`` counts, per upstream, the consecutive leading blocks it holds;
      upstreams holding none are left out. Its cost grows with the depth matched, not
      with the number of upstreams.
    """

    __slots__ = ("_capacity", "_holders", "_lru")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be at least 1, got {capacity_blocks}")
        self._capacity = capacity_blocks
        self._lru: dict[Hashable, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[Hashable]] = {}

    def record(self, upstream: Hashable, blocks: Sequence[int]) -> None:
        lru = self._lru.get(upstream)
        if lru is None:
            lru = self._lru[upstream] = OrderedDict()
        holders = self._holders
        for block in reversed(blocks[: self._capacity]):
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            held = holders.get(block)
            if held is None:
                holders[block] = {upstream}
            else:
                held.add(upstream)
        while len(lru) > self._capacity:
            evicted, _ = lru.popitem(last=False)
            held = holders[evicted]
            held.discard(upstream)
            if not held:
                del holders[evicted]

    def matched(self, blocks: Sequence[int]) -> dict[Hashable, int]:
        if not blocks:
            return {}
        holders = self._holders
        first = holders.get(blocks[0])
        if not first:
            return {}
        alive = set(first)
        depth = 1
        result: dict[Hashable, int] = {}
        for block in blocks[1:]:
            held = holders.get(block)
            if held is None:
                break
            still = alive & held
            if len(still) != len(alive):
                for upstream in alive - still:
                    result[upstream] = depth
                if not still:
                    return result
                alive = still
            depth += 1
        for upstream in alive:
            result[upstream] = depth
        return result

    def seen(self, block: int) -> bool:
        """Whether any upstream holds ``block``."""
        return block in self._holders

    def held(self, upstream: Hashable) -> int:
        """How many blocks ``upstream`` holds."""
        lru = self._lru.get(upstream)
        return 0 if lru is None else len(lru)

    def drop(self, block: int) -> None:
        """Forget ``block`` on every upstream, so a prompt starting with it matches none."""
        for upstream in self._holders.pop(block, ()):
            del self._lru[upstream][block]

    def forget(self, upstream: Hashable) -> None:
        """Drop everything recorded for ``upstream``."""
        lru = self._lru.pop(upstream, None)
        if lru is None:
            return
        for block in lru:
            held = self._holders[block]
            held.discard(upstream)
            if not held:
                del self._holders[block]
