"""How L1 entries reach the disk: one packed log batch per commit, and log rewrites.

A commit appends the dirty keys as one row of `entries_batches`: a blob of packed records
(key length u32, value length i32 with -1 for a deletion, expire_at i64 with 0 for none,
then the key and value bytes; packed by the L1 table's `encode`) plus one CRC32 over the
blob. Packing costs ~0.3 us per record where binding one SQLite row per record cost ~4-5 us
(measured: 800 writes commit in ~0.25 ms against ~3.5 ms), so a commit costs about one
small row whatever it holds. Commits of more than `BATCH_RECORDS` records are split into
several rows. Opening reads the legacy keyed table `entries` (version 1 files; empty once
a rewrite has run) and then replays the batches in order, later records winning.

Rewrites keep the log bounded, the way Redis rewrites its AOF, without ever stopping the
writer. Once the log holds more than twice as many records as there are live keys, and
more than `rewrite_after_idle` (10k) records while the owner is idle or `rewrite_after`
(1M) under load (or more bytes of records than twice the live bytes and
`rewrite_after_bytes`, 64 MiB: large values rewritten often), a rewrite starts: it snapshots the list of live keys, and each commit from
then on also re-logs the current state of the next keys of that list (at least
`rewrite_slice` (1024) of them and twice as many as the commit's own records, so a rewrite
outpaces the writes, but no more bytes than `rewrite_slice_bytes` (1 MiB) or twice the
commit's own, whichever is more: 1024 keys of large values would make one commit, and the
WAL it is bounded by, large), as does every maintenance step while the owner is idle. A key's
re-logged record is its state at that moment and everything after it is logged after
it, so replay stays exact however slices and commits interleave. When the last slice is
written, every batch older than the rewrite's start (and the legacy table) is deleted in
the same transaction: each key live at the start has been re-logged since, each key
deleted before it is simply absent. A rewrite costs about 1-2 us per live key, all of it
sequential appends (folding records into a keyed table cost 13-25 us per record in random
B-tree writes); under load the log stays within about three times the live keys (or
the 1M-record threshold), and idle time compacts it to about the live keys.
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from typing import Callable, Iterator, Sequence

from .scan import KeySnapshot

BATCH_RECORDS = 1024
_HEADER = struct.Struct("<IiQ")
_HEADER_SIZE = _HEADER.size
_INSERT_BATCH = "INSERT INTO entries_batches (records, count, crc) VALUES (?, ?, ?)"
_UPSERT = "INSERT OR REPLACE INTO entries (key, value, expire_at, crc) VALUES (?, ?, ?, ?)"
_DELETE = "DELETE FROM entries WHERE key = ?"

Encoder = Callable[[Sequence[bytes]], bytes]  # keys -> their current state as packed records

# (key, value or None for a deletion, expire_at or None, crc or None when the batch was checked)
Row = tuple[bytes, "bytes | None", "int | None", "int | None"]


class DamagedBatch(Exception):
    """A log batch fails its checksum; the argument is its sequence number."""


def create_batches_table(conn: sqlite3.Connection) -> None:
    """Schema step 1 -> 2: the batch log replaces the row-per-write `entries_log`."""
    conn.execute("CREATE TABLE entries_batches (seq INTEGER PRIMARY KEY, records BLOB NOT NULL, "
                 "count INTEGER NOT NULL, crc INTEGER NOT NULL)")
    latest: dict[bytes, tuple] = {}
    for key, value, expire_at, crc in conn.execute(
            "SELECT key, value, expire_at, crc FROM entries_log ORDER BY seq"):
        key = bytes(key)
        latest.pop(key, None)
        latest[key] = (value, expire_at, crc)
    _apply(conn, latest)
    conn.execute("DROP TABLE entries_log")


def decode_batch(blob: bytes) -> Iterator[tuple[bytes, "bytes | None", "int | None"]]:
    unpack, pos, end = _HEADER.unpack_from, 0, len(blob)
    while pos < end:
        key_len, value_len, expire_at = unpack(blob, pos)
        pos += _HEADER_SIZE
        key = blob[pos:pos + key_len]
        pos += key_len
        if value_len < 0:
            yield key, None, None
            continue
        yield key, blob[pos:pos + value_len], expire_at or None
        pos += value_len


REWRITE_SLICE = 1024
# A slice also stops once it has packed this many bytes (or twice its commit's own, if more).
REWRITE_SLICE_BYTES = 1024 * 1024


class EntryLog:
    def __init__(self, rewrite_after: int = 1_000_000, rewrite_after_idle: int = 10_000,
                 rewrite_slice: int = REWRITE_SLICE, rewrite_after_bytes: int = 64 * 1024 * 1024,
                 rewrite_slice_bytes: int = REWRITE_SLICE_BYTES) -> None:
        self.rewrite_after = rewrite_after  # records before a rewrite starts under load...
        self.rewrite_after_idle = rewrite_after_idle  # ...and while the owner is idle
        self.rewrite_after_bytes = rewrite_after_bytes  # ...or bytes of batches, past twice the live bytes
        self.rewrite_slice = rewrite_slice  # keys re-logged per step, at least...
        self.rewrite_slice_bytes = rewrite_slice_bytes  # ...unless they pack to this many bytes
        self.records = 0  # records in the log batches
        self.bytes = 0  # bytes of packed records in the log batches
        self.rewrites = 0  # rewrites completed
        self._rewrite: _Rewrite | None = None

    @property
    def rewriting(self) -> bool:
        return self._rewrite is not None

    def rewrite_due(self, live_count: int, idle: bool, live_bytes: int = 0) -> bool:
        """Whether to start a rewrite: the log holds over twice the live keys, and more than
        the threshold for an idle or a busy owner; or over twice the live bytes, and more than
        `rewrite_after_bytes` (large values rewritten often would otherwise grow the file far
        past the data before the record count says so)."""
        if self._rewrite is not None:
            return False
        threshold = self.rewrite_after_idle if idle else self.rewrite_after
        return (self.records > max(threshold, 2 * live_count)
                or self.bytes > max(self.rewrite_after_bytes, 2 * live_bytes))

    def append(self, conn: sqlite3.Connection, keys: Sequence[bytes], encode: Encoder, *, flushed: bool) -> int:
        """Log the current state of `keys` (packed by `encode`, the L1 table's encoder);
        returns the bytes of packed records written."""
        if flushed:
            conn.execute("DELETE FROM entries")
            conn.execute("DELETE FROM entries_batches")
            self.records = self.bytes = 0
            self._rewrite = None  # what it was rewriting is gone
        count = len(keys)
        return sum(self._insert(conn, keys[start:start + BATCH_RECORDS] if count > BATCH_RECORDS else keys, encode)
                   for start in range(0, count, BATCH_RECORDS))

    def start_rewrite(self, conn: sqlite3.Connection, live_keys: KeySnapshot) -> None:
        """Start re-logging `live_keys` (every key now live: a list, or the L1 table's
        snapshot, whose slices hold the keys still live), unless a rewrite is running."""
        if self._rewrite is None:
            newest = conn.execute("SELECT coalesce(max(seq), 0) FROM entries_batches").fetchone()[0]
            self._rewrite = _Rewrite(live_keys, newest + 1, self.records, self.bytes)

    def rewrite_step(self, conn: sqlite3.Connection, encode: Encoder, max_keys: int | None = None,
                     max_bytes: int | None = None) -> bool:
        """Re-log the current state of up to `max_keys` (default `rewrite_slice`) more keys of
        the running rewrite, stopping early once `max_bytes` (default `rewrite_slice_bytes`;
        0 for no limit) are packed, and finishing the rewrite when no keys are left; True
        while it has more to do.

        The byte limit keeps a slice of large values from making one commit large (1024 keys
        of 64 KiB are 64 MiB). Keys are packed in chunks of at least one key and at most
        BATCH_RECORDS, each at most twice the last and sized to what is left of the limit at
        the bytes per record the last chunk packed, so values of a steady size overshoot the
        limit by at most one value, and a sudden run of larger ones by one chunk of them."""
        rewrite = self._rewrite
        if rewrite is None:
            return False
        max_keys = max_keys or self.rewrite_slice
        budget = self.rewrite_slice_bytes if max_bytes is None else max_bytes
        keys = rewrite.keys
        position, end, packed = rewrite.position, min(rewrite.position + max_keys, len(keys)), 0
        while position < end and not (budget and packed >= budget):
            chunk = BATCH_RECORDS
            if budget:
                chunk = max(1, min(BATCH_RECORDS, 2 * rewrite.chunk, (budget - packed) // rewrite.record_bytes))
                rewrite.chunk = chunk
            stop = min(position + chunk, end)
            wrote = self._insert(conn, keys[position:stop], encode)
            if wrote:
                rewrite.record_bytes = max(1, wrote // (stop - position))
            packed += wrote
            position = stop
        rewrite.position = position
        if position < len(keys):
            return True
        conn.execute("DELETE FROM entries_batches WHERE seq < ?", (rewrite.start_seq,))
        conn.execute("DELETE FROM entries")
        self.records -= rewrite.records_before
        self.bytes -= rewrite.bytes_before
        self._rewrite = None
        self.rewrites += 1
        return False

    def _insert(self, conn: sqlite3.Connection, keys: Sequence[bytes], encode: Encoder) -> int:
        if not keys:
            return 0
        blob = encode(keys)
        conn.execute(_INSERT_BATCH, (blob, len(keys), zlib.crc32(blob)))
        self.records += len(keys)
        self.bytes += len(blob)
        return len(blob)

    def rolled_back(self) -> None:
        """The transaction of the last append or rewrite step did not commit: a running
        rewrite must not go on from positions that were never written (the next one starts
        afresh). `records` may count a little high until the next open."""
        self._rewrite = None

    def read(self, conn: sqlite3.Connection) -> Iterator[Row]:
        """Every stored row in write order: the legacy table, then the log (later rows win)."""
        yield from conn.execute("SELECT key, value, expire_at, crc FROM entries ORDER BY rowid")
        self.records = self.bytes = 0
        for seq, blob, count, crc in conn.execute(
                "SELECT seq, records, count, crc FROM entries_batches ORDER BY seq"):
            if zlib.crc32(blob) != crc:
                raise DamagedBatch(seq)
            self.records += count
            self.bytes += len(blob)
            for key, value, expire_at in decode_batch(blob):
                yield key, value, expire_at, None


class _Rewrite:
    """A rewrite in progress: the keys to re-log, how far it got, where it started."""

    __slots__ = ("keys", "position", "start_seq", "records_before", "bytes_before", "record_bytes", "chunk")

    def __init__(self, keys: KeySnapshot, start_seq: int, records_before: int, bytes_before: int) -> None:
        self.keys = keys
        self.position = 0
        self.start_seq = start_seq  # batches with a smaller seq predate the rewrite
        self.records_before = records_before  # records in those batches
        self.bytes_before = bytes_before  # and their bytes
        # Keys in the last chunk a byte-limited step packed, and its packed bytes per record.
        self.chunk = 8
        self.record_bytes = 1


def _apply(conn: sqlite3.Connection, latest: dict[bytes, tuple]) -> None:
    """Write the last state of each key into `entries` (a crc of None is computed here)."""
    conn.executemany(_DELETE, [(key,) for key, (value, _, _) in latest.items() if value is None])
    conn.executemany(_UPSERT, [(key, value, expire_at, zlib.crc32(value) if crc is None else crc)
                               for key, (value, expire_at, crc) in latest.items() if value is not None])
