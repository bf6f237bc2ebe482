"""PrefixCache: a bounded LRU set of prompt blocks keyed by chained block hash."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Which prompt blocks the simulated server still holds computed KV for.

    Keys are chained block hashes (see `gateway.sim.tokens`): the hash of block i folds
    in the hash of block i-1, so one key stands for a whole prefix and a hit on block i
    is only usable if blocks 0..i-1 hit too. Plain code: no I/O, no clock, no asyncio.
    """

    __slots__ = ("_blocks", "_capacity_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        """Hold at most `capacity_blocks` blocks; 0 makes every lookup a miss."""
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self._capacity_blocks = capacity_blocks
        # Insertion order is recency order: the first key is the least recently used.
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    @property
    def capacity_blocks(self) -> int:
        """Most blocks the cache holds at once."""
        return self._capacity_blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def lookup_and_insert(self, block_hashes: Sequence[bytes]) -> int:
        """Count the leading blocks already cached, then cache all of them.

        Returns how many of `block_hashes`, counted from the first, were cached before the
        call, stopping at the first miss. Afterwards every block of the prompt is cached
        and most recently used, except that when the prompt alone exceeds the capacity
        only its first `capacity_blocks` blocks are kept; older blocks are evicted least
        recently used first. Never holds more than `capacity_blocks` blocks.
        """
        if self._capacity_blocks == 0:
            return 0
        hits = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            hits += 1
        # Touch the blocks last-to-first so the head of the prompt is the most recently
        # used: under pressure the tail is evicted before the head. Evicting the head first
        # would make every later block of the chain unreachable while it still took space;
        # vLLM frees a finished sequence's blocks in reverse order for the same reason.
        for block_hash in reversed(block_hashes):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self._capacity_blocks:
            self._blocks.popitem(last=False)
        return hits

    def clear(self) -> None:
        """Forget every block, as after a server restart."""
        self._blocks.clear()
