"""Rendezvous (highest random weight) hashing: the same key picks the same upstream on
every pod, and removing an upstream moves only the keys it held."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_MASK = (1 << 64) - 1


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process (``hash()`` is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def weight(key: int, salt: int) -> int:
    """The rendezvous weight of ``key`` on the upstream with ``salt`` (a 64-bit mix)."""
    z = (key ^ salt) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def pick(key: int, candidates: Iterable[tuple[str, int]]) -> str | None:
    """The candidate ``(name, salt)`` with the highest weight for ``key``; None if empty.

    Ties (a 2**-64 event) go to the smaller name, so the answer never depends on order.
    """
    best: str | None = None
    best_weight = -1
    for name, salt in candidates:
        w = weight(key, salt)
        if w > best_weight or (w == best_weight and best is not None and name < best):
            best, best_weight = name, w
    return best
