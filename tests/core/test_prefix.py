"""Prefix hashing, the bounded prefix index and rendezvous hashing: the routing decisions
that every gateway pod must compute alike, without talking to the others."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.prefix import MAX_BLOCKS, prompt_blocks
from gateway.core.prefixindex import PrefixIndex
from gateway.core.rendezvous import pick, stable_hash, weight

B = 16
"""Block size used by most tests: small, so prompts stay readable."""

REPO = Path(__file__).resolve().parents[2]


def blocks(text: str | bytes, *, model: str = "llama", block_bytes: int = B) -> tuple[int, ...]:
    data = text.encode() if isinstance(text, str) else text
    return prompt_blocks(data, seed=model.encode(), block_bytes=block_bytes)


def block_text(i: int) -> bytes:
    """One full block of distinct bytes, ``B`` long."""
    return f"block-{i:03d}-".encode().ljust(B, b".")


# -- prompt_blocks ------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [0, 1, 3, 5])
def test_prompts_sharing_k_leading_blocks_share_exactly_k_hashes(shared: int) -> None:
    """Two prompts agree on the hashes of the blocks they share and on no later one."""
    common = b"".join(block_text(i) for i in range(shared))
    # the tails differ only in their first byte; every later byte is the same, so any
    # later hash that differs does so because the chain carries the difference forward
    tail = b"".join(block_text(i) for i in range(shared, 6))
    a = blocks(common + b"A" + tail[1:])
    b = blocks(common + b"B" + tail[1:])
    assert len(a) == len(b) == 6
    assert a[:shared] == b[:shared]
    assert all(x != y for x, y in zip(a[shared:], b[shared:], strict=True))


def test_the_same_prompt_for_another_model_shares_no_hash() -> None:
    """The model seeds the chain: a prompt sent to two models shares no block hash."""
    text = b"".join(block_text(i) for i in range(8))
    llama, qwen, unnamed = (
        blocks(text, model="llama"),
        blocks(text, model="qwen"),
        blocks(text, model=""),
    )
    assert len(llama) == len(qwen) == len(unnamed) == 8
    assert not set(llama) & set(qwen)
    assert not set(llama) & set(unnamed)
    assert not set(qwen) & set(unnamed)


def test_the_same_prompt_and_model_hash_the_same_every_time() -> None:
    """Hashing is a pure function of prompt, model and block size."""
    text = b"".join(block_text(i) for i in range(5))
    assert blocks(text) == blocks(bytes(text))
    assert blocks(text, block_bytes=8) != blocks(text, block_bytes=16)


@pytest.mark.parametrize(
    ("length", "expected_blocks"),
    [(0, 0), (1, 0), (B - 1, 0), (B, 1), (B + 1, 1), (2 * B - 1, 1), (2 * B, 2), (5 * B + 7, 5)],
)
def test_only_full_blocks_are_hashed(length: int, expected_blocks: int) -> None:
    """A trailing partial block has no hash; a prompt shorter than a block has none."""
    text = bytes(range(256)) * 4
    assert len(blocks(text[:length])) == expected_blocks


def test_appending_less_than_a_block_changes_no_hash() -> None:
    """Text that does not fill a block leaves the hashes of the full blocks as they were."""
    text = b"".join(block_text(i) for i in range(3))
    assert blocks(text + b"partial") == blocks(text)
    assert blocks(b"short") == ()


def test_hashes_are_64_bit_non_negative_integers() -> None:
    """Each hash fits an unsigned 64-bit integer (what the index and rendezvous take)."""
    for h in blocks(b"".join(block_text(i) for i in range(20))):
        assert isinstance(h, int)
        assert 0 <= h < 2**64


def test_at_most_256_blocks_are_hashed() -> None:
    """A long prompt yields 256 hashes: the first 256 blocks, the rest does not count."""
    text = bytes(range(256)) * 40  # 10240 bytes: 640 blocks of 16
    capped = blocks(text)
    assert MAX_BLOCKS == 256
    assert len(capped) == 256
    assert capped == prompt_blocks(text, seed=b"llama", block_bytes=B, max_blocks=640)[:256]


@pytest.mark.parametrize("max_blocks", [0, 1, 3, 10])
def test_max_blocks_caps_the_hashes_at_the_head_of_the_prompt(max_blocks: int) -> None:
    """``max_blocks`` keeps the leading hashes, the same ones an uncapped call returns."""
    text = b"".join(block_text(i) for i in range(10))
    full = blocks(text)
    capped = prompt_blocks(text, seed=b"llama", block_bytes=B, max_blocks=max_blocks)
    assert capped == full[:max_blocks]


def test_hashes_are_the_same_in_another_process_with_another_hash_seed() -> None:
    """Every pod computes the same hashes: no per-process salt (PYTHONHASHSEED) leaks in."""
    text = "system: you are helpful\x1e" * 20
    code = (
        "from gateway.core.prefix import prompt_blocks\n"
        "from gateway.core.rendezvous import stable_hash\n"
        f"print(list(prompt_blocks({text.encode()!r}, seed=b'llama', block_bytes=32)))\n"
        "print(stable_hash('session-42'))\n"
    )
    expected = (
        f"{list(prompt_blocks(text.encode(), seed=b'llama', block_bytes=32))}\n"
        f"{stable_hash('session-42')}\n"
    )
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert result.stdout == expected


@pytest.mark.parametrize("block_bytes", [0, -1, -256])
def test_a_block_size_below_one_is_refused(block_bytes: int) -> None:
    """A block size that cannot cut a prompt into blocks raises, naming the argument."""
    with pytest.raises(ValueError, match="block_bytes"):
        prompt_blocks(b"some prompt", seed=b"llama", block_bytes=block_bytes)


# -- PrefixIndex ----------------------------------------------------------------------------------

PROMPT = blocks(b"".join(block_text(i) for i in range(6)))
OTHER = blocks(b"".join(block_text(100 + i) for i in range(4)))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (PROMPT, {"a": 6, "b": 3, "c": 1}),
        (PROMPT[:4], {"a": 4, "b": 3, "c": 1}),
        (PROMPT[:2], {"a": 2, "b": 2, "c": 1}),
        (PROMPT[:1], {"a": 1, "b": 1, "c": 1}),
        (OTHER, {"d": 4}),
        (OTHER[:2], {"d": 2}),
        (blocks(b"".join(block_text(200 + i) for i in range(3))), {}),
        ((), {}),
    ],
    ids=["full", "four", "two", "one", "other", "other-head", "unseen", "empty"],
)
def test_matched_counts_leading_blocks_per_upstream(
    query: tuple[int, ...], expected: dict[str, int]
) -> None:
    """Each upstream is credited with the leading blocks it holds; none-holders are left out."""
    index = PrefixIndex(capacity_blocks=100)
    index.record("a", PROMPT)
    index.record("b", PROMPT[:3])
    index.record("c", PROMPT[:1])
    index.record("d", OTHER)
    assert index.matched(query) == expected


def test_a_prompt_diverging_after_shared_blocks_matches_only_the_shared_ones() -> None:
    """A holder of prompt P matches a prompt Q on the blocks P and Q share, no more."""
    index = PrefixIndex(capacity_blocks=100)
    shared = b"".join(block_text(i) for i in range(3))
    index.record("a", blocks(shared + block_text(50) + block_text(51)))
    assert index.matched(blocks(shared + block_text(60) + block_text(61))) == {"a": 3}


def test_blocks_held_without_their_head_do_not_match() -> None:
    """Only consecutive leading blocks count: holding blocks 2..4 without block 1 is no match."""
    index = PrefixIndex(capacity_blocks=100)
    index.record("a", PROMPT[1:4])
    assert index.matched(PROMPT) == {}
    index.record("a", PROMPT[:1])
    assert index.matched(PROMPT) == {"a": 4}


def test_under_pressure_a_prompts_tail_is_forgotten_before_its_head() -> None:
    """When an upstream's LRU is full, the oldest prompt loses its last blocks first."""
    index = PrefixIndex(capacity_blocks=4)
    index.record("a", PROMPT[:4])
    index.record("a", OTHER[:1])
    assert index.held("a") == 4
    assert index.matched(PROMPT) == {"a": 3}
    index.record("a", OTHER[1:3])
    assert index.matched(PROMPT) == {"a": 1}
    assert index.matched(OTHER) == {"a": 3}


def test_using_a_prompt_again_keeps_it_over_an_older_one() -> None:
    """Recording a prompt again makes it recent, so an older prompt is evicted first."""
    first, second, third = (blocks(block_text(i) + block_text(i + 10)) for i in range(3))
    index = PrefixIndex(capacity_blocks=4)
    index.record("a", first)
    index.record("a", second)
    index.record("a", first)  # first is now the most recent
    index.record("a", third)
    assert index.matched(first) == {"a": 2}
    assert index.matched(second) == {}
    assert index.matched(third) == {"a": 2}


def test_a_prompt_longer_than_the_capacity_keeps_its_head() -> None:
    """An upstream never holds more than the capacity, even from a single long prompt."""
    index = PrefixIndex(capacity_blocks=3)
    index.record("a", PROMPT)
    assert index.held("a") == 3
    assert index.matched(PROMPT) == {"a": 3}


def test_forget_drops_an_upstream_and_leaves_the_others() -> None:
    """After ``forget(u)`` nothing matches on ``u``; blocks only it held are unseen."""
    index = PrefixIndex(capacity_blocks=100)
    index.record("a", PROMPT)
    index.record("b", PROMPT[:2])
    index.record("a", OTHER)
    index.forget("a")
    assert index.held("a") == 0
    assert index.matched(PROMPT) == {"b": 2}
    assert index.matched(OTHER) == {}
    assert not index.seen(OTHER[0])
    assert not index.seen(PROMPT[3])
    assert index.seen(PROMPT[0])
    index.forget("never-recorded")  # no error
    index.record("a", OTHER[:1])
    assert index.matched(OTHER) == {"a": 1}


def test_seen_tells_whether_any_upstream_holds_a_block() -> None:
    """``seen`` is True exactly for blocks some upstream still holds."""
    index = PrefixIndex(capacity_blocks=2)
    assert not index.seen(PROMPT[0])
    index.record("a", PROMPT[:2])
    assert index.seen(PROMPT[0])
    assert index.seen(PROMPT[1])
    assert not index.seen(PROMPT[2])
    index.record("a", OTHER[:2])  # evicts both blocks of PROMPT
    assert not index.seen(PROMPT[0])
    assert index.seen(OTHER[1])


@pytest.mark.parametrize("capacity", [0, -1])
def test_a_capacity_below_one_is_refused(capacity: int) -> None:
    """An index that could hold nothing is a configuration mistake, refused at once."""
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixIndex(capacity)


class ReferenceLru:
    """The documented contract, written the slow and obvious way."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: dict[str, OrderedDict[int, None]] = {}

    def record(self, upstream: str, prompt: tuple[int, ...]) -> None:
        lru = self.held.setdefault(upstream, OrderedDict())
        for block in reversed(prompt):  # the first block ends up the most recent
            lru.pop(block, None)
            lru[block] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def forget(self, upstream: str) -> None:
        self.held.pop(upstream, None)

    def matched(self, prompt: tuple[int, ...]) -> dict[str, int]:
        result = {}
        for upstream, lru in self.held.items():
            depth = 0
            while depth < len(prompt) and prompt[depth] in lru:
                depth += 1
            if depth:
                result[upstream] = depth
        return result


UPSTREAMS = ["a", "b", "c"]
# prompts over a two-letter alphabet with one-byte blocks share prefixes all the time
texts = st.text(alphabet="xy", min_size=1, max_size=8)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(UPSTREAMS), texts),
        st.tuples(st.just("forget"), st.sampled_from(UPSTREAMS), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(min_value=1, max_value=6), ops=operations)
def test_the_index_stays_bounded_and_matches_only_blocks_still_held(
    capacity: int, ops: list[tuple[str, str, str]]
) -> None:
    """Whatever is recorded, no upstream holds more than the capacity, and ``matched``
    credits an upstream only with leading blocks it still holds (an LRU, not a leak)."""
    index = PrefixIndex(capacity)
    reference = ReferenceLru(capacity)
    probes: set[tuple[int, ...]] = set()
    for op, upstream, text in ops:
        prompt = blocks(text, block_bytes=1)
        if op == "record":
            index.record(upstream, prompt)
            reference.record(upstream, prompt)
            probes.update(prompt[:n] for n in range(1, len(prompt) + 1))
        else:
            index.forget(upstream)
            reference.forget(upstream)
        for u in UPSTREAMS:
            assert index.held(u) <= capacity
            assert index.held(u) == len(reference.held.get(u, ()))
        for probe in probes:
            assert index.matched(probe) == reference.matched(probe)
            held_anywhere = any(probe[0] in lru for lru in reference.held.values())
            assert index.seen(probe[0]) == held_anywhere


# -- rendezvous --------------------------------------------------------------------------------

NAMES = [f"http://vllm-{i}:8000" for i in range(4)]


def salted(names: list[str]) -> list[tuple[str, int]]:
    return [(name, stable_hash(name)) for name in names]


KEYS = [stable_hash(f"key-{i}") for i in range(4000)]


def test_pick_is_deterministic_and_ignores_candidate_order() -> None:
    """The same key picks the same upstream however the candidates are listed."""
    forward, backward = salted(NAMES), salted(NAMES[::-1])
    rotated = salted(NAMES[2:] + NAMES[:2])
    for key in KEYS[:500]:
        chosen = pick(key, forward)
        assert chosen == pick(key, forward)
        assert chosen == pick(key, backward) == pick(key, rotated)
        assert chosen is not None
        assert weight(key, stable_hash(chosen)) == max(weight(key, s) for _, s in forward)


def test_pick_of_no_candidates_is_none() -> None:
    """With nowhere to go there is no answer, not an error."""
    assert pick(KEYS[0], []) is None


@pytest.mark.parametrize("removed", NAMES)
def test_removing_a_candidate_moves_only_the_keys_it_held(removed: str) -> None:
    """When an upstream leaves, its keys move elsewhere and every other key stays put."""
    before = salted(NAMES)
    after = salted([n for n in NAMES if n != removed])
    moved = 0
    for key in KEYS[:2000]:
        old, new = pick(key, before), pick(key, after)
        if old == removed:
            moved += 1
            assert new != removed
        else:
            assert new == old
    assert moved > 0


def test_keys_spread_roughly_evenly_over_four_candidates() -> None:
    """Over 4000 keys each of 4 upstreams gets between 15% and 35%."""
    candidates = salted(NAMES)
    counts = dict.fromkeys(NAMES, 0)
    for key in KEYS:
        chosen = pick(key, candidates)
        assert chosen is not None
        counts[chosen] += 1
    for name, count in counts.items():
        assert 0.15 * len(KEYS) <= count <= 0.35 * len(KEYS), (name, counts)


def test_prompt_heads_spread_roughly_evenly_over_four_candidates() -> None:
    """New prefixes are placed by their first block hash: those spread evenly too."""
    candidates = salted(NAMES)
    counts = dict.fromkeys(NAMES, 0)
    for i in range(4000):
        head = prompt_blocks(f"{i:06d}: user prompt".encode(), seed=b"llama", block_bytes=16)
        chosen = pick(head[0], candidates)
        assert chosen is not None
        counts[chosen] += 1
    for name, count in counts.items():
        assert 600 <= count <= 1400, (name, counts)


def test_stable_hash_is_a_64_bit_function_of_the_text() -> None:
    """``stable_hash`` gives the same 64-bit number for the same text, others for others."""
    assert stable_hash("abc") == stable_hash("abc")
    assert stable_hash("abc") != stable_hash("abd")
    assert 0 <= stable_hash("") < 2**64
