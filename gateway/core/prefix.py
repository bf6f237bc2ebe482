"""Prefix hashing for routing: chained hashes of fixed-size blocks of a prompt.

Block ``i`` is hashed together with everything before it, so two prompts share the hash of
block ``i`` exactly when they share their first ``i + 1`` blocks (up to hash collisions,
which cost at most a misplaced request, never a wrong answer). The hashes are the same in
every process and on every machine (no per-process salt), so every gateway pod computes
the same ones: that is what lets pods agree on where a prefix lives without talking.
"""

from __future__ import annotations

import zlib

MAX_BLOCKS = 256
"""At most this many leading blocks of a prompt are hashed; the rest does not count."""


def prompt_blocks(
    text: bytes, *, seed: bytes, block_bytes: int, max_blocks: int = MAX_BLOCKS
) -> tuple[int, ...]:
    """The chained 64-bit hash of each full ``block_bytes`` block of ``text``.

    ``seed`` (the model name) starts the chain, so the same prompt sent to two models
    hashes differently. A trailing partial block has no hash: a prompt shorter than one
    block has none at all. At most ``max_blocks`` hashes are returned.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
    crc32, adler32 = zlib.crc32, zlib.adler32
    low, high = crc32(seed), adler32(seed)
    stop = min(len(text) // block_bytes, max_blocks) * block_bytes
    view = memoryview(text)
    hashes = []
    for start in range(0, stop, block_bytes):
        block = view[start : start + block_bytes]
        # two different checksums, each continued over the whole prefix: 64 bits in all
        low, high = crc32(block, low), adler32(block, high)
        hashes.append((high << 32) | low)
    return tuple(hashes)
