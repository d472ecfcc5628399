"""The RAM tier: decoded saved states in an LRU bounded by a byte budget.

Holds states ready to hand to llama.cpp (no checksum or decompression on a hit). Shared by
the engine thread (lookup, store), the cache's writer thread (reads to write to disk) and
the event loop (fleet prefetch puts), hence the lock; every operation is O(1) apart from
evicting, which drops the least recently used entries until the new one fits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from node.cache.blob import StateBlob


class RamTier:
    """An LRU of `StateBlob`s keyed by chained block hash, at most `budget_bytes` of state."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"RAM budget must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[bytes, StateBlob] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted_bytes = 0
        self.evictions = 0

    def get(self, key: bytes) -> StateBlob | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries

    def put(self, key: bytes, entry: StateBlob) -> bool:
        """Insert (or refresh) an entry; False when it is larger than the whole budget."""
        size = len(entry.state)
        if size > self.budget_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.state)
            while self._entries and self._bytes + size > self.budget_bytes:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= len(victim.state)
                self.evicted_bytes += len(victim.state)
                self.evictions += 1
            self._entries[key] = entry
            self._bytes += size
            return True

    def discard(self, key: bytes) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.state)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
