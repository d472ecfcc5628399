"""L1 entries: bytes keys and values with TTLs under an LRU byte budget, served from RAM.

Every value lives in one ordered dict (key -> value) whose order is the LRU order: reads
and writes move a key to the end, eviction pops from the front. Holding all values in RAM
keeps GET a dict lookup (~0.2 us) rather than a SQLite read (~5 us), and the byte budget
(key + value + ENTRY_OVERHEAD per entry) bounds that RAM. Measured: the daemon holding 1M
keys with 16-byte values has about 260 MiB of RSS. The database is the durable copy: it is read once at open
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
        self._deadlines = self._expiry.deadlines  # the same dict for the queue's lifetime
        self._dirty: dict[bytes, None] = {}
        self._flushes: list[None] = []  # a FLUSH not yet committed (a list: see pending_queues)
        self._scans = ScanCursors()
        self.log = EntryLog()
        self.hits = self.misses = self.evicted = self.expired = 0

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value = self._values.get(key)
        if value is None or (self._deadlines and self._expire_if_due(key)):
            self.misses += 1
            return None
        self._values.move_to_end(key)
        self.hits += 1
        return value

    def get_with_deadline(self, key: bytes) -> tuple[bytes, int | None] | None:
        """(value, expire_at_ms or None), or None: what read-modify-write commands need."""
        value = self.get(key)
        if value is None:
            return None
        deadlines = self._deadlines
        return (value, deadlines.get(key) if deadlines else None)

    def get_entry(self, key: bytes) -> Entry | None:
        found = self.get_with_deadline(key)
        return None if found is None else Entry(*found)

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
            raise self._too_big(size)
        if expire_at_ms is not None:
            if expire_at_ms <= now_ms():
                self.delete(key)
                return
            self._expiry.set(key, expire_at_ms)
        elif self._deadlines:
            self._deadlines.pop(key, None)
        values = self._values
        old = values.pop(key, None)
        values[key] = value
        self.used_bytes += size if old is None else len(value) - len(old)
        self._dirty[key] = None
        if self.used_bytes > self.max_bytes:
            self._evict()

    def put_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """Set every (key, value) without a TTL (MSET); all or nothing when one is too big."""
        limit = self.max_bytes - ENTRY_OVERHEAD
        for key, value in pairs:
            if len(key) + len(value) > limit:
                raise self._too_big(len(key) + len(value) + ENTRY_OVERHEAD)
        values, deadlines, dirty = self._values, self._deadlines, self._dirty
        pop = values.pop
        added = 0
        for key, value in pairs:
            old = pop(key, None)
            values[key] = value
            added += len(key) + len(value) + ENTRY_OVERHEAD if old is None else len(value) - len(old)
            dirty[key] = None
            if deadlines:
                deadlines.pop(key, None)
        self.used_bytes += added
        if self.used_bytes > self.max_bytes:
            self._evict()

    def put_each(self, commands: list[list[bytes]]) -> int:
        """put(key, value) for each [name, key, value] in order, exactly as one call per
        command would (per-key LRU, TTL cleared, eviction after each); stops before an entry
        over the budget and returns how many were applied. For pipelined `SET key value`."""
        values, dirty, deadlines, max_bytes = self._values, self._dirty, self._deadlines, self.max_bytes
        limit = max_bytes - ENTRY_OVERHEAD
        get, move_to_end = values.get, values.move_to_end
        used = self.used_bytes
        for applied, (_, key, value) in enumerate(commands):
            size = len(key) + len(value)
            if size > limit:
                self.used_bytes = used
                return applied
            if deadlines:
                deadlines.pop(key, None)
            old = get(key)
            values[key] = value
            if old is None:
                used += size + ENTRY_OVERHEAD
            else:
                move_to_end(key)
                used += len(value) - len(old)
            dirty[key] = None
            if used > max_bytes:
                self.used_bytes = used
                self._evict()
                used = self.used_bytes
        self.used_bytes = used
        return len(commands)

    def _too_big(self, size: int) -> ArchiveOOMError:
        return ArchiveOOMError(
            f"command not allowed when used memory > 'maxmemory': an entry of {size} bytes "
            f"exceeds the L1 budget of {self.max_bytes} bytes")

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
        self._flushes[:] = [None]

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
        return len(self._dirty) + bool(self._flushes)

    @property
    def pending_queues(self) -> tuple:
        return (self._dirty, self._flushes)

    def write_pending(self, conn: sqlite3.Connection) -> None:
        self.log.append(conn, self._dirty, self._values, self._expiry.deadlines, flushed=bool(self._flushes))

    def committed(self) -> None:
        self._dirty.clear()
        self._flushes.clear()

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
