"""Active expiry: a heap of (deadline ms, key) over the keys of the L1 table that have a TTL.

The table (arca/archive/_l1table.c) holds each key's deadline; the heap only says which keys
to look at first. It may hold stale pairs (TTL changed or key deleted); a popped pair counts
only when the table still has that deadline for that key, and the heap is rebuilt from the
table when stale pairs outnumber live ones.
"""

from __future__ import annotations

import heapq
import time
from typing import Any


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ExpiryQueue:
    def __init__(self, table: Any) -> None:
        self._table = table
        self._heap: list[tuple[int, bytes]] = []

    def add(self, key: bytes, expire_at_ms: int) -> None:
        heapq.heappush(self._heap, (expire_at_ms, key))
        if len(self._heap) > 2 * self._table.ttl_count + 1024:
            self.rebuild()

    def rebuild(self) -> None:
        self._heap = self._table.ttl_items()
        heapq.heapify(self._heap)

    def due(self, now: int, limit: int) -> list[bytes]:
        """Up to `limit` keys whose deadline has passed (still in the table)."""
        heap, deadline_of, found = self._heap, self._table.deadline, []
        while heap and heap[0][0] <= now and len(found) < limit:
            deadline, key = heapq.heappop(heap)
            if deadline_of(key) == deadline:
                found.append(key)
        return found

    def clear(self) -> None:
        self._heap.clear()
