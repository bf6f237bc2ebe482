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

    def hits(self, block_hashes: Sequence[bytes]) -> int:
        """How many of `block_hashes`, counted from the first, are cached, up to the first
        miss. Reads only: recency is unchanged."""
        hits = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            hits += 1
        return hits

    def insert(self, block_hashes: Sequence[bytes]) -> None:
        """Cache every block of `block_hashes` as most recently used.

        When the blocks alone exceed the capacity, only the first `capacity_blocks` are
        kept; older blocks are evicted least recently used first. Never holds more than
        `capacity_blocks` blocks.
        """
        if self._capacity_blocks == 0:
            return
        # Touch the blocks last-to-first so the head of the prompt is the most recently
        # used: under pressure the tail is evicted before the head. Evicting the head first
        # would make every later block of the chain unreachable while it still took space;
        # vLLM frees a finished sequence's blocks in reverse order for the same reason.
        for block_hash in reversed(block_hashes):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self._capacity_blocks:
            self._blocks.popitem(last=False)

    def lookup_and_insert(self, block_hashes: Sequence[bytes]) -> int:
        """`hits()` then `insert()`: the leading blocks cached before the call."""
        hits = self.hits(block_hashes)
        self.insert(block_hashes)
        return hits

    def discard(self, block_hashes: Sequence[bytes]) -> None:
        """Forget these blocks (their KV memory was handed to other sequences)."""
        for block_hash in block_hashes:
            self._blocks.pop(block_hash, None)

    def clear(self) -> None:
        """Forget every block, as after a server restart."""
        self._blocks.clear()
