"""KVCache: blocks held per sequence, shared prompt blocks counted once, released whole."""

from __future__ import annotations

import pytest

from gateway.sim.kvcache import KVCache

PROMPT = (b"a", b"b", b"c")  # three full prompt blocks, by chained hash


def test_a_shared_prompt_block_is_held_once_and_freed_with_its_last_holder() -> None:
    """Two sequences with the same prefix use its blocks once, as vLLM's ref counts do."""
    cache = KVCache(10, share_prefixes=True)
    cache.grow(1, PROMPT, 4)  # three prompt blocks and one private
    assert cache.cost(2, PROMPT, 4) == 1  # only the private block is new
    cache.grow(2, PROMPT, 4)
    assert (cache.used, cache.free, cache.held(2), cache.holders(b"a")) == (5, 5, 4, 2)
    cache.release(1)
    assert (cache.used, cache.holders(b"a")) == (4, 1)
    cache.release(2)
    assert (cache.used, cache.holders(b"a")) == (0, 0)


def test_without_sharing_every_block_is_private() -> None:
    """With prefix caching off, equal prompts still need their own blocks."""
    cache = KVCache(10, share_prefixes=False)
    cache.grow(1, PROMPT, 3)
    assert cache.cost(2, PROMPT, 3) == 3
    cache.grow(2, PROMPT, 3)
    assert cache.used == 6


@pytest.mark.parametrize(("held", "target", "cost"), [(0, 2, 2), (2, 2, 0), (2, 5, 3), (5, 3, 0)])
def test_cost_counts_only_the_blocks_beyond_those_held(held: int, target: int, cost: int) -> None:
    """Growing a table costs the missing blocks; shrinking is not a thing."""
    cache = KVCache(10, share_prefixes=True)
    cache.grow(1, PROMPT, held)
    assert cache.cost(1, PROMPT, target) == cost
