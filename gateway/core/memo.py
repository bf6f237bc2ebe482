"""``Memo``: a dictionary of recent answers that starts over when it is full.

The request path remembers answers that cost a parse or a hash (a path's exemption, an
API key's tenant, a peer's trust) under keys clients choose. A bound is what keeps a
client sending endless new values from growing the memory; starting over, rather than
evicting one entry at a time, keeps every lookup a plain ``dict`` lookup.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V]):
    """A ``dict`` holding at most ``size`` entries; ``keep`` adds one, emptying it first
    when it is full. Reads are those of ``dict``: ``memo.get(key)``, ``memo[key]``.

    Safe to share between threads as a ``dict`` is: every change is one step.
    """

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def keep(self, key: K, value: V) -> V:
        """Remember ``value`` under ``key`` and return it."""
        if len(self) >= self.size and key not in self:
            self.clear()
        self[key] = value
        return value
