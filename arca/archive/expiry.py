"""Key expiry bookkeeping: absolute deadlines in ms and a heap for active expiry.

`deadlines` maps key -> expire_at_ms for keys that have a TTL. The heap holds (deadline, key)
pairs and may contain stale pairs (TTL changed or key deleted); they are skipped when popped
and the heap is rebuilt when stale pairs outnumber live ones.
"""

from __future__ import annotations

import heapq
import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ExpiryQueue:
    def __init__(self) -> None:
        self.deadlines: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []

    def set(self, key: bytes, expire_at_ms: int) -> None:
        self.deadlines[key] = expire_at_ms
        heapq.heappush(self._heap, (expire_at_ms, key))
        if len(self._heap) > 2 * len(self.deadlines) + 1024:
            self._heap = [(deadline, k) for k, deadline in self.deadlines.items()]
            heapq.heapify(self._heap)

    def discard(self, key: bytes) -> None:
        self.deadlines.pop(key, None)

    def is_expired(self, key: bytes, now: int) -> bool:
        deadline = self.deadlines.get(key)
        return deadline is not None and deadline <= now

    def due(self, now: int, limit: int) -> list[bytes]:
        """Up to `limit` keys whose deadline has passed, removed from the queue."""
        heap, deadlines, found = self._heap, self.deadlines, []
        while heap and heap[0][0] <= now and len(found) < limit:
            deadline, key = heapq.heappop(heap)
            if deadlines.get(key) == deadline:
                del deadlines[key]
                found.append(key)
        return found

    def clear(self) -> None:
        self.deadlines.clear()
        self._heap.clear()

    def __len__(self) -> int:
        return len(self.deadlines)
