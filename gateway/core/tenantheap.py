"""``TenantHeap``: tenants ordered by a key that changes often, for the fair queue."""

from __future__ import annotations

import heapq


class TenantHeap:
    """Tenants ordered by a key that changes often.

    ``set`` pushes a fresh entry and makes the tenant's older ones stale; stale entries are
    dropped when they reach the top, and the heap is rebuilt when they pile up.
    """

    __slots__ = ("_heap", "_next", "_version")

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[float, ...], int, str]] = []
        self._version: dict[str, int] = {}
        self._next = 0

    def set(self, tenant: str, key: tuple[float, ...]) -> None:
        self._next += 1
        self._version[tenant] = self._next
        heapq.heappush(self._heap, (key, self._next, tenant))
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._version):
            live = [e for e in self._heap if self._version.get(e[2]) == e[1]]
            heapq.heapify(live)
            self._heap = live

    def discard(self, tenant: str) -> None:
        self._version.pop(tenant, None)

    def top(self) -> tuple[tuple[float, ...], str] | None:
        heap, version = self._heap, self._version
        while heap:
            key, number, tenant = heap[0]
            if version.get(tenant) == number:
                return key, tenant
            heapq.heappop(heap)
        return None
