"""KVCache: the simulated GPU's KV memory, in blocks, held by the sequences in the batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.errors import OblethError


class PromptTooLong(OblethError, ValueError):
    """A prompt needs more KV blocks than the whole cache has, so it could never run.

    Raised when the request is submitted, before it waits: the HTTP API answers it with a
    400 `invalid_request_error`, as vLLM refuses a prompt over `max_model_len`.
    """

    def __init__(self, prompt_tokens: int, kv_cache_blocks: int, block_size_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.kv_cache_blocks = kv_cache_blocks
        self.block_size_tokens = block_size_tokens
        capacity = kv_cache_blocks * block_size_tokens
        super().__init__(
            f"the prompt is {prompt_tokens} tokens, but the simulated KV cache holds at most "
            f"{capacity} tokens (kv_cache_blocks={kv_cache_blocks} blocks of "
            f"block_size_tokens={block_size_tokens}); shorten the prompt, or start the "
            "simulator with a larger kv_cache_blocks (--kv-cache-blocks)"
        )


@dataclass(slots=True)
class _Table:
    """The blocks one sequence holds: shared prompt blocks by hash, then private ones."""

    shared: list[bytes] = field(default_factory=list)
    private: int = 0

    @property
    def blocks(self) -> int:
        return len(self.shared) + self.private


class KVCache:
    """Which KV blocks the sequences in the batch hold, and how many are free.

    A sequence holds one block per `block_size_tokens` tokens whose KV exists or is being
    computed, counted from its first token. With `share_prefixes` (prefix caching on),
    a full prompt block is identified by its chained hash and held once however many
    sequences hold it, as vLLM shares cached prefix blocks by reference count; every
    other block (a prompt's partial last block, generated tokens, everything when sharing
    is off) is private to its sequence.

    Plain code: no clock, no I/O, no asyncio. Callers check `cost()` against `free`
    before `grow()`; `grow()` itself never refuses, so the caller owns the decision.
    """

    __slots__ = ("_num_blocks", "_private", "_refs", "_share", "_tables")

    def __init__(self, num_blocks: int, *, share_prefixes: bool) -> None:
        """A cache of `num_blocks` blocks, all free."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self._num_blocks = num_blocks
        self._share = share_prefixes
        self._tables: dict[int, _Table] = {}
        # Hash of a shared block -> how many sequences hold it.
        self._refs: dict[bytes, int] = {}
        self._private = 0

    @property
    def num_blocks(self) -> int:
        """Size of the cache, in blocks."""
        return self._num_blocks

    @property
    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return len(self._refs) + self._private

    @property
    def free(self) -> int:
        """Blocks nobody holds."""
        return self._num_blocks - self.used

    def held(self, seq_id: int) -> int:
        """Blocks in `seq_id`'s table (shared ones included); 0 for an unknown sequence."""
        table = self._tables.get(seq_id)
        return table.blocks if table is not None else 0

    def holders(self, block_hash: bytes) -> int:
        """How many sequences hold the shared block `block_hash`."""
        return self._refs.get(block_hash, 0)

    def cost(self, seq_id: int, block_hashes: Sequence[bytes], blocks: int) -> int:
        """Free blocks needed to grow `seq_id`'s table to `blocks` blocks.

        `block_hashes` are the sequence's full prompt blocks; block i of the table is
        shared when sharing is on and i < len(block_hashes), and costs nothing when
        another sequence already holds it.
        """
        start = self.held(seq_id)
        if not self._share:
            return max(0, blocks - start)
        needed = 0
        for index in range(start, blocks):
            if index >= len(block_hashes) or block_hashes[index] not in self._refs:
                needed += 1
        return needed

    def grow(self, seq_id: int, block_hashes: Sequence[bytes], blocks: int) -> None:
        """Grow `seq_id`'s table to `blocks` blocks (no effect if it already has as many)."""
        table = self._tables.setdefault(seq_id, _Table())
        for index in range(table.blocks, blocks):
            if self._share and index < len(block_hashes):
                block_hash = block_hashes[index]
                table.shared.append(block_hash)
                self._refs[block_hash] = self._refs.get(block_hash, 0) + 1
            else:
                table.private += 1
                self._private += 1

    def release(self, seq_id: int) -> None:
        """Give back every block of `seq_id` (finished, withdrawn or preempted)."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return
        self._private -= table.private
        for block_hash in table.shared:
            left = self._refs[block_hash] - 1
            if left:
                self._refs[block_hash] = left
            else:
                del self._refs[block_hash]

    def clear(self) -> None:
        """Release every sequence's blocks."""
        self._tables.clear()
        self._refs.clear()
        self._private = 0
