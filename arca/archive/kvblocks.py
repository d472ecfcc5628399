"""L3 KV blocks: write-once blobs (prefix KV state) under their own LRU byte budget.

Only the index (key -> size, in LRU order) lives in RAM; blobs stay in SQLite and are read
on `get`, verified against the CRC32 stored beside them (a mismatch is logged, the block is
dropped and the read is a miss). A key is never rewritten: `put` of a present key returns
False. The budget is separate from L1's: filling L3 never evicts an L1 entry. Uncommitted
blobs are served from the pending map until the next group commit writes them.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections import OrderedDict
from typing import Sequence

from .errors import ArchiveOOMError

log = logging.getLogger(__name__)


class KVBlocks:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._sizes: OrderedDict[bytes, int] = OrderedDict()
        self._pending: dict[bytes, tuple[bytes, int]] = {}
        self._deleted: list[tuple[bytes]] = []
        self.hits = self.misses = self.evicted = self.damaged = 0

    def __len__(self) -> int:
        return len(self._sizes)

    def put(self, key: bytes, blob: bytes) -> bool:
        if key in self._sizes:
            return False
        if len(blob) > self.max_bytes:
            raise ArchiveOOMError(f"a KV block of {len(blob)} bytes exceeds the L3 budget of "
                                  f"{self.max_bytes} bytes")
        blob = bytes(blob)
        self._sizes[key] = len(blob)
        self.used_bytes += len(blob)
        self._pending[key] = (blob, zlib.crc32(blob))
        while self.used_bytes > self.max_bytes:
            self._drop(next(iter(self._sizes)))
            self.evicted += 1
        return True

    def get(self, conn: sqlite3.Connection, key: bytes) -> bytes | None:
        if key not in self._sizes:
            self.misses += 1
            return None
        pending = self._pending.get(key)
        if pending is not None:
            blob = pending[0]
        else:
            row = conn.execute("SELECT blob, crc FROM kv_blocks WHERE key = ?", (key,)).fetchone()
            if row is None or zlib.crc32(row[0]) != row[1]:
                log.warning("KV block %r is missing or fails its checksum: dropped", key[:64])
                self._drop(key)
                self.damaged += 1
                self.misses += 1
                return None
            blob = row[0]
        self._sizes.move_to_end(key)
        self.hits += 1
        return blob

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return [key in self._sizes for key in keys]

    def _drop(self, key: bytes) -> None:
        self.used_bytes -= self._sizes.pop(key)
        if self._pending.pop(key, None) is None:
            self._deleted.append((key,))

    # -- persistence -----------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return len(self._pending) + len(self._deleted)

    @property
    def pending_queues(self) -> tuple:
        return (self._pending, self._deleted)

    def write_pending(self, conn: sqlite3.Connection) -> None:
        if self._deleted:
            conn.executemany("DELETE FROM kv_blocks WHERE key = ?", self._deleted)
        if self._pending:
            conn.executemany("INSERT OR IGNORE INTO kv_blocks (key, blob, size, crc) VALUES (?, ?, ?, ?)",
                             [(key, blob, len(blob), crc) for key, (blob, crc) in self._pending.items()])

    def committed(self) -> None:
        self._pending.clear()
        self._deleted.clear()

    def rolled_back(self) -> None:
        pass  # the pending blocks stay pending and go with the next commit

    def load(self, conn: sqlite3.Connection) -> None:
        for key, size in conn.execute("SELECT key, size FROM kv_blocks ORDER BY rowid"):
            self._sizes[bytes(key)] = size
            self.used_bytes += size
        while self.used_bytes > self.max_bytes:
            self._drop(next(iter(self._sizes)))
            self.evicted += 1

    def stats(self) -> dict[str, int]:
        return {
            "kv_blocks": len(self._sizes),
            "kv_used_bytes": self.used_bytes,
            "kv_max_bytes": self.max_bytes,
            "kv_hits": self.hits,
            "kv_misses": self.misses,
            "kv_evicted": self.evicted,
            "kv_damaged": self.damaged,
        }
