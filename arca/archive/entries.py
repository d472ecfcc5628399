"""L1 entries: bytes keys and values with TTLs under an LRU byte budget, served from RAM.

Every entry lives in the L1 table (`_l1table.Table`, a C extension: one hash probe per
read or write, key and value bytes inline in one allocation per entry, an exact LRU list
and the dirty mark in a 24-byte slot, the deadline heap of active expiry); this module is
its Python face: the budget check that answers `-OOM`, running active expiry, SCAN
cursors, loading at open and handing dirty keys to the entry log. Holding all values
in RAM keeps GET a hash probe rather than a SQLite read (~5 us), and the byte budget
(key + value + ENTRY_OVERHEAD per entry) bounds that RAM. The database is the durable
copy: it is read once at open (LRU order is rebuilt from write order) and written by
group commit.

Writes mark keys dirty in the table; `write_pending` packs them into log batches
(entry_log.py) inside the commit's transaction.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ._l1table import Table
from .config import ENTRY_OVERHEAD
from .errors import ArchiveCorruptError, ArchiveOOMError
from .expiry import now_ms
from .entry_log import DamagedBatch, EntryLog
from .scan import ScanCursors
from .watch import Watches

log = logging.getLogger(__name__)

_KEYS_CHUNK = 1024  # keys made into bytes objects at a time by Entries.keys()
# Records loaded between clearings of the dirty list at open: held to the end, the listed
# key objects (one per key) left their pymalloc arenas resident among the entries, about
# 25 MiB of RSS per million keys after a restart, measured.
_LOAD_CLEAN_EVERY = 4096


@dataclass(frozen=True, slots=True)
class Entry:
    value: bytes
    expire_at_ms: int | None


class Entries:
    def __init__(self, max_bytes: int) -> None:
        self.table = Table(max_bytes, ENTRY_OVERHEAD)
        self._flushes: list[None] = []  # a FLUSH not yet committed (a list: see pending_queues)
        self._scans = ScanCursors()
        self.log = EntryLog()
        self.watches = Watches(self.table)
        self._random = random.Random()

    def __len__(self) -> int:
        return len(self.table)

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        return self.table.get(key)

    def get_with_deadline(self, key: bytes) -> tuple[bytes, int | None] | None:
        """(value, expire_at_ms or None), or None: what read-modify-write commands need."""
        return self.table.get_with_deadline(key)

    def get_entry(self, key: bytes) -> Entry | None:
        found = self.table.get_with_deadline(key)
        return None if found is None else Entry(*found)

    def exists(self, key: bytes) -> bool:
        return self.table.contains(key)

    def keys(self) -> Iterator[bytes]:
        """Every live key, least recently used first, made into bytes objects a chunk at a
        time (the table holds keys inline, so a full list would cost a bytes object per key)."""
        contains, snapshot = self.table.contains, self.table.snapshot()
        for start in range(0, len(snapshot), _KEYS_CHUNK):
            for key in snapshot[start:start + _KEYS_CHUNK]:
                if contains(key):
                    yield key

    def scan(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        return self._scans.page(cursor, count, self.table.snapshot, self.table.contains)

    def random_key(self) -> bytes | None:
        """A live key drawn at random from a snapshot of the key list (8 bytes a key, no bytes
        object per key); after a few draws that hit keys gone meanwhile, the first live key
        from a random point on."""
        snapshot, contains = self.table.snapshot(), self.table.contains
        count = len(snapshot)
        if not count:
            return None
        for _ in range(16):
            key = snapshot[self._random.randrange(count)]
            if key is not None and contains(key):
                return key
        start = self._random.randrange(count)
        for index in range(count):
            key = snapshot[(start + index) % count]
            if key is not None and contains(key):
                return key
        return None

    # -- writes --------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, expire_at_ms: int | None = None) -> None:
        size = len(key) + len(value) + ENTRY_OVERHEAD
        if size > self.table.max_bytes:
            raise self._too_big(size)
        if expire_at_ms is not None:
            if expire_at_ms <= now_ms():
                self.table.delete(key)
                return
        self.table.put(key, value, expire_at_ms)

    def put_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """Set every (key, value) without a TTL (MSET); all or nothing when one is too big."""
        limit = self.table.max_bytes - ENTRY_OVERHEAD
        for key, value in pairs:
            if len(key) + len(value) > limit:
                raise self._too_big(len(key) + len(value) + ENTRY_OVERHEAD)
        put = self.table.put
        for key, value in pairs:
            put(key, value)

    def _too_big(self, size: int) -> ArchiveOOMError:
        return ArchiveOOMError(
            f"command not allowed when used memory > 'maxmemory': an entry of {size} bytes "
            f"exceeds the L1 budget of {self.table.max_bytes} bytes")

    def delete(self, key: bytes) -> bool:
        return self.table.delete(key)

    def set_expire(self, key: bytes, expire_at_ms: int | None) -> bool:
        table = self.table
        if not table.contains(key):
            return False
        if expire_at_ms is None:
            if table.deadline(key) is not None:
                table.set_deadline(key, None)
        elif expire_at_ms <= now_ms():
            table.delete(key)
        else:
            table.set_deadline(key, expire_at_ms)
        return True

    def flush(self) -> None:
        self.watches.flushing()
        self.table.clear()
        self._scans.clear()
        self._flushes[:] = [None]

    def expire_due(self, limit: int = 1000) -> int:
        """Active expiry: delete up to `limit` keys whose deadline has passed."""
        if not self.table.ttl_count:
            return 0
        return self.table.expire_due(limit)  # the table keeps the deadline heap

    # -- persistence ---------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return len(self.table.dirty) + bool(self._flushes)

    @property
    def pending_queues(self) -> tuple:
        return (self.table.dirty, self._flushes)

    def write_pending(self, conn: sqlite3.Connection) -> None:
        dirty = self.table.dirty
        records = len(dirty)
        packed = self.log.append(conn, dirty, self.table.encode, flushed=bool(self._flushes))
        # A commit carries a rewrite twice as far as its own records, so rewrites outpace
        # writes, and (values being large) no further than twice its own bytes or the slice's.
        self._advance_rewrite(conn, idle=False, max_keys=max(self.log.rewrite_slice, 2 * records),
                              max_bytes=max(self.log.rewrite_slice_bytes, 2 * packed))

    def committed(self) -> None:
        self.watches.before_clear()
        self.table.clear_dirty()
        self._flushes.clear()

    def rolled_back(self) -> None:
        self.log.rolled_back()

    # -- log maintenance (see entry_log.py) -------------------------------------------------

    def maintenance_due(self) -> bool:
        """Whether an idle owner should call maintenance_step (a log rewrite to run)."""
        return self.log.rewriting or self.log.rewrite_due(len(self.table), True, self.table.used_bytes)

    def maintenance_step(self, conn: sqlite3.Connection) -> bool:
        """One slice of log rewrite inside the caller's transaction; True while there is more
        to do. (Pending writes may be logged later: every record is a key's state when it
        was written and replay keeps the last, so the order of the two does not matter.)"""
        return self._advance_rewrite(conn, idle=True, max_keys=self.log.rewrite_slice)

    def _advance_rewrite(self, conn: sqlite3.Connection, *, idle: bool, max_keys: int,
                         max_bytes: int | None = None) -> bool:
        """Start a rewrite when one is due, then re-log up to `max_keys` keys (and about
        `max_bytes`, default the log's slice bytes) of the running one; True while it has
        more to do."""
        if self.log.rewrite_due(len(self.table), idle, self.table.used_bytes):
            self.log.start_rewrite(conn, self.table.snapshot())
        return self.log.rewrite_step(conn, self.table.encode, max_keys, max_bytes)

    def compact(self, conn: sqlite3.Connection) -> int:
        """Rewrite the whole log now (inside the caller's transaction); returns the records
        it held before."""
        before = self.log.records
        self.log.start_rewrite(conn, self.table.snapshot())
        while self.log.rewrite_step(conn, self.table.encode, 1 << 20, 0):
            pass
        return before

    def load(self, conn: sqlite3.Connection, path: Path) -> None:
        """Read every stored entry in write order; a row failing its checksum is corruption."""
        table, damaged = self.table, []
        budget, table.max_bytes = table.max_bytes, 1 << 62  # evict once everything is read
        try:
            for count, (key, value, expire_at, crc) in enumerate(self.log.read(conn), 1):
                if not count % _LOAD_CLEAN_EVERY:
                    table.clear_dirty()  # what is read is on disk already (see below)
                key = bytes(key)
                if value is None:
                    table.delete(key)
                    continue
                if crc is not None and zlib.crc32(value) != crc:
                    damaged.append(key)
                    table.delete(key)
                    continue
                table.put(key, bytes(value), expire_at)
        except DamagedBatch as exc:
            raise ArchiveCorruptError(path, f"L1 log batch {exc.args[0]} fails its checksum") from None
        finally:
            table.max_bytes = budget
        if damaged:
            raise ArchiveCorruptError(path, f"{len(damaged)} L1 entries fail their checksum "
                                            f"(first key {damaged[0][:64]!r})")
        table.clear_dirty()  # what was just read is on disk already
        self.expire_due(limit=table.ttl_count + 1)
        if table.used_bytes > table.max_bytes:
            log.info("L1 budget is smaller than the stored entries: evicted %d", table.evict())
