"""PrefixCache: leading-hit counting, LRU eviction, bounded size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.prefixcache import PrefixCache


def _blocks(names: str) -> list[bytes]:
    """'abc' -> [b'a', b'b', b'c']: one letter per block hash, for readable tables."""
    return [name.encode() for name in names]


@pytest.mark.parametrize(
    ("cached", "query", "hits"),
    [
        ("", "abc", 0),
        ("abc", "abc", 3),
        ("abc", "ab", 2),
        ("ab", "abcd", 2),
        ("abc", "xbc", 0),  # a miss on block 0 makes the rest unusable
        ("ac", "abc", 1),  # counting stops at the first miss
        ("abc", "", 0),
    ],
)
def test_lookup_counts_only_leading_consecutive_cached_blocks(
    cached: str, query: str, hits: int
) -> None:
    """Hits are the cached blocks counted from the first one up to the first miss."""
    cache = PrefixCache(capacity_blocks=16)
    for block in _blocks(cached):
        cache.lookup_and_insert([block])
    assert cache.lookup_and_insert(_blocks(query)) == hits


def test_lookup_caches_every_block_so_a_repeat_hits_fully() -> None:
    """After one lookup, the same prompt hits on all of its blocks."""
    cache = PrefixCache(capacity_blocks=16)
    assert cache.lookup_and_insert(_blocks("abcd")) == 0
    assert cache.lookup_and_insert(_blocks("abcd")) == 4


@pytest.mark.parametrize(
    ("capacity", "history", "query", "hits"),
    [
        # "ab" was used before "cd"; adding "ef" evicts the least recently used prompt.
        (4, ["ab", "cd", "ef"], "ab", 0),
        (4, ["ab", "cd", "ef"], "cd", 2),
        # Touching "ab" again makes "cd" the oldest, so "cd" goes instead.
        (4, ["ab", "cd", "ab", "ef"], "ab", 2),
        (4, ["ab", "cd", "ab", "ef"], "cd", 0),
        # Under pressure a prompt loses its tail before its head.
        (3, ["abcd"], "abcd", 3),
        (3, ["ab", "cde"], "cde", 3),
        (3, ["abc", "xy"], "abc", 1),
    ],
)
def test_least_recently_used_blocks_are_evicted_first(
    capacity: int, history: list[str], query: str, hits: int
) -> None:
    """Eviction removes the least recently used blocks, a prompt's tail before its head."""
    cache = PrefixCache(capacity_blocks=capacity)
    for prompt in history:
        cache.lookup_and_insert(_blocks(prompt))
    assert cache.lookup_and_insert(_blocks(query)) == hits


def test_zero_capacity_disables_the_cache() -> None:
    """With no capacity every lookup misses and nothing is stored."""
    cache = PrefixCache(capacity_blocks=0)
    cache.lookup_and_insert(_blocks("abc"))
    assert cache.lookup_and_insert(_blocks("abc")) == 0
    assert len(cache) == 0


def test_looking_up_does_not_make_blocks_recent() -> None:
    """hits() only reads: a request that is looked at but not admitted protects nothing."""
    cache = PrefixCache(capacity_blocks=4)
    cache.insert(_blocks("ab"))
    cache.insert(_blocks("cd"))
    assert cache.hits(_blocks("ab")) == 2
    cache.insert(_blocks("ef"))
    assert cache.hits(_blocks("ab")) == 0
    assert cache.hits(_blocks("cd")) == 2


def test_discarded_blocks_miss_and_cut_the_chain_behind_them() -> None:
    """A preempted sequence's blocks leave the cache; a prefix hit stops at the first gap."""
    cache = PrefixCache(capacity_blocks=8)
    cache.insert(_blocks("abcd"))
    cache.discard(_blocks("c"))
    assert cache.hits(_blocks("abcd")) == 2
    assert len(cache) == 3


def test_clear_forgets_every_block() -> None:
    """A cleared cache behaves like a new one."""
    cache = PrefixCache(capacity_blocks=8)
    cache.lookup_and_insert(_blocks("abc"))
    cache.clear()
    assert cache.lookup_and_insert(_blocks("abc")) == 0


@settings(database=None, max_examples=200)
@given(
    capacity=st.integers(min_value=0, max_value=8),
    prompts=st.lists(st.text(alphabet="abcdefgh", max_size=10), max_size=20),
)
def test_cache_never_exceeds_capacity_and_hits_never_exceed_the_prompt(
    capacity: int, prompts: list[str]
) -> None:
    """Whatever the traffic, size stays within capacity and hits within the prompt."""
    cache = PrefixCache(capacity_blocks=capacity)
    for prompt in prompts:
        blocks = list(dict.fromkeys(_blocks(prompt)))  # chained hashes never repeat
        hits = cache.lookup_and_insert(blocks)
        assert 0 <= hits <= len(blocks)
        assert len(cache) <= capacity
        assert all(block in cache for block in blocks[:capacity])
