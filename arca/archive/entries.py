"""L1 entries: bytes keys and values with TTLs under an LRU byte budget, served from RAM.

Every value lives in one ordered dict (key -> value) whose order is the LRU order: reads
and writes move a key to the end, eviction pops from the front. Holding all values in RAM
keeps GET a dict lookup (~0.2 us) rather than a SQLite read (~5 us), and the byte budget
(key + value + ENTRY_OVERHEAD per entry) bounds that RAM. Measured: 1M keys with 3-byte
values cost about 170 MB of RSS. The database is the durable copy: it is read once at open
(LRU order is rebuilt from write order) and written by group commit.

Writes mark keys dirty; `write_pending` packs the dirty set into one batch appended to the
entry log (entry_log.py) inside the commit's transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .config import ENTRY_OVERHEAD
from .errors import ArchiveCorruptError, ArchiveOOMError
from .expiry import ExpiryQueue, now_ms
from .entry_log import DamagedBatch, EntryLog
from .scan import ScanCursors

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Entry:
    value: bytes
    expire_at_ms: int | None


class Entries:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._values: OrderedDict[bytes, bytes] = OrderedDict()
        self._expiry = ExpiryQueue()
        self._dirty: dict[bytes, None] = {}
        self._flushed = False
        self._scans = ScanCursors()
        self.log = EntryLog()
        self.hits = self.misses = self.evicted = self.expired = 0

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value = self._values.get(key)
        if value is None or (self._expiry.deadlines and self._expire_if_due(key)):
            self.misses += 1
            return None
        self._values.move_to_end(key)
        self.hits += 1
        return value

    def get_entry(self, key: bytes) -> Entry | None:
        value = self.get(key)
        return None if value is None else Entry(value, self._expiry.deadlines.get(key))

    def exists(self, key: bytes) -> bool:
        return key in self._values and not self._expire_if_due(key)

    def keys(self) -> Iterator[bytes]:
        now = now_ms()
        for key in list(self._values):
            if key in self._values and not self._expiry.is_expired(key, now):
                yield key

    def scan(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        now = now_ms()
        return self._scans.page(cursor, count, lambda: list(self._values),
                                lambda key: key in self._values and not self._expiry.is_expired(key, now))

    def __len__(self) -> int:
        return len(self._values)

    @property
    def expires_count(self) -> int:
        return len(self._expiry)

    # -- writes --------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, expire_at_ms: int | None = None) -> None:
        size = len(key) + len(value) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            raise ArchiveOOMError(
                f"command not allowed when used memory > 'maxmemory': an entry of {size} bytes "
                f"exceeds the L1 budget of {self.max_bytes} bytes")
        if expire_at_ms is not None and expire_at_ms <= now_ms():
            self.delete(key)
            return
        old = self._values.pop(key, None)
        if old is not None:
            self.used_bytes -= len(key) + len(old) + ENTRY_OVERHEAD
        self._values[key] = value
        self.used_bytes += size
        if expire_at_ms is not None:
            self._expiry.set(key, expire_at_ms)
        elif self._expiry.deadlines:
            self._expiry.discard(key)
        self._dirty[key] = None
        if self.used_bytes > self.max_bytes:
            self._evict()

    def delete(self, key: bytes) -> bool:
        value = self._values.pop(key, None)
        if value is None:
            return False
        self.used_bytes -= len(key) + len(value) + ENTRY_OVERHEAD
        self._expiry.discard(key)
        self._dirty[key] = None
        return True

    def set_expire(self, key: bytes, expire_at_ms: int | None) -> bool:
        if not self.exists(key):
            return False
        if expire_at_ms is None:
            if key in self._expiry.deadlines:
                self._expiry.discard(key)
                self._dirty[key] = None
        elif expire_at_ms <= now_ms():
            self.delete(key)
        else:
            self._expiry.set(key, expire_at_ms)
            self._dirty[key] = None
        return True

    def flush(self) -> None:
        self._values.clear()
        self._expiry.clear()
        self._dirty.clear()
        self._scans.clear()
        self.used_bytes = 0
        self._flushed = True

    def expire_due(self, limit: int = 1000) -> int:
        """Active expiry: delete up to `limit` keys whose deadline has passed."""
        due = self._expiry.due(now_ms(), limit)
        for key in due:
            self._drop(key)
        self.expired += len(due)
        return len(due)

    def _expire_if_due(self, key: bytes) -> bool:
        deadline = self._expiry.deadlines.get(key)
        if deadline is None or deadline > now_ms():
            return False
        self._expiry.discard(key)
        self._drop(key)
        self.expired += 1
        return True

    def _drop(self, key: bytes) -> None:
        value = self._values.pop(key, None)
        if value is not None:
            self.used_bytes -= len(key) + len(value) + ENTRY_OVERHEAD
            self._dirty[key] = None

    def _evict(self) -> None:
        values, deadlines = self._values, self._expiry.deadlines
        while self.used_bytes > self.max_bytes:
            key, value = values.popitem(last=False)
            self.used_bytes -= len(key) + len(value) + ENTRY_OVERHEAD
            if deadlines:
                deadlines.pop(key, None)
            self._dirty[key] = None
            self.evicted += 1

    # -- persistence ---------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return len(self._dirty) + self._flushed

    def write_pending(self, conn: sqlite3.Connection) -> None:
        self.log.append(conn, self._dirty, self._values, self._expiry.deadlines, flushed=self._flushed)

    def committed(self) -> None:
        self._dirty.clear()
        self._flushed = False

    def load(self, conn: sqlite3.Connection, path: Path) -> None:
        """Read every stored entry in write order; a row failing its checksum is corruption."""
        values, deadlines, damaged = self._values, {}, []
        try:
            for key, value, expire_at, crc in self.log.read(conn):
                key = bytes(key)
                values.pop(key, None)
                deadlines.pop(key, None)
                if value is None:
                    continue
                if crc is not None and zlib.crc32(value) != crc:
                    damaged.append(key)
                    continue
                values[key] = value
                if expire_at is not None:
                    deadlines[key] = expire_at
        except DamagedBatch as exc:
            raise ArchiveCorruptError(path, f"L1 log batch {exc.args[0]} fails its checksum") from None
        if damaged:
            raise ArchiveCorruptError(path, f"{len(damaged)} L1 entries fail their checksum "
                                            f"(first key {damaged[0][:64]!r})")
        self.used_bytes = sum(len(key) + len(value) for key, value in values.items()) + ENTRY_OVERHEAD * len(values)
        for key, deadline in deadlines.items():
            self._expiry.set(key, deadline)
        self.expire_due(limit=len(deadlines) + 1)
        if self.used_bytes > self.max_bytes:
            before = len(values)
            self._evict()
            log.info("L1 budget is smaller than the stored entries: evicted %d", before - len(values))
