"""How L1 entries reach the disk: one packed log batch per commit, folded into a keyed table later.

A commit appends the dirty keys as one row of `entries_batches`: a blob of packed records
(key length u32, value length i32 with -1 for a deletion, expire_at i64 with 0 for none,
then the key and value bytes; packed by the L1 table's `encode`) plus one CRC32 over the blob. Packing costs ~0.3 us per
record where binding one SQLite row per record cost ~4-5 us (measured: 800 writes commit in
~0.25 ms against ~3.5 ms), so a commit costs about one small row whatever it holds. Commits
with more than `BATCH_RECORDS` records are split into several rows so that no fold has to
take a huge batch at once.

Folding moves the oldest batches into `entries` (one row per key, last write wins) and
deletes them, about `fold_slice` records per transaction. It is not part of the write
path: the log folder thread (folder.py) folds while the owner is idle, and at any time
once the log holds more than `fold_after` records (writes with no idle time at all), which
bounds the log (replaying 4M records at open takes a few seconds). Folding is the
expensive part: random keys dirty most pages of the keyed table, so a slice of 1024
records over 100k keys costs 10-25 ms (measured), which is why it is kept off the thread
serving clients. Opening reads `entries` in write order and then replays the log batches.
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from typing import Callable, Iterator, Sequence

BATCH_RECORDS = 1024
_HEADER = struct.Struct("<IiQ")
_HEADER_SIZE = _HEADER.size
_INSERT_BATCH = "INSERT INTO entries_batches (records, count, crc) VALUES (?, ?, ?)"
_UPSERT = "INSERT OR REPLACE INTO entries (key, value, expire_at, crc) VALUES (?, ?, ?, ?)"
_DELETE = "DELETE FROM entries WHERE key = ?"

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


class EntryLog:
    def __init__(self, fold_after: int = 4_000_000, fold_slice: int = 1024) -> None:
        self.fold_after = fold_after
        self.fold_slice = fold_slice
        self.backlog = 0  # records in the log, not yet folded into `entries`
        self.folds = 0

    def append(self, conn: sqlite3.Connection, keys: Sequence[bytes], encode: Callable[[Sequence[bytes]], bytes],
               *, flushed: bool) -> None:
        """Log the current state of `keys` (packed by `encode`, the L1 table's encoder)."""
        if flushed:
            conn.execute("DELETE FROM entries")
            conn.execute("DELETE FROM entries_batches")
            self.backlog = 0
        count = len(keys)
        for start in range(0, count, BATCH_RECORDS):
            chunk = keys[start:start + BATCH_RECORDS] if count > BATCH_RECORDS else keys
            blob = encode(chunk)
            conn.execute(_INSERT_BATCH, (blob, len(chunk), zlib.crc32(blob)))
        self.backlog += count

    def fold(self, conn: sqlite3.Connection, limit: int | None = None) -> int:
        """Fold the oldest batches (at least one, about `limit` records; all when None) into
        `entries`; returns the number of records folded."""
        latest: dict[bytes, tuple] = {}
        folded = last_seq = 0
        for seq, blob, count, crc in conn.execute(
                "SELECT seq, records, count, crc FROM entries_batches ORDER BY seq"):
            if zlib.crc32(blob) != crc:
                raise DamagedBatch(seq)
            for key, value, expire_at in decode_batch(blob):
                latest.pop(key, None)
                latest[key] = (value, expire_at, None)
            folded += count
            last_seq = seq
            if limit is not None and folded >= limit:
                break
        if not last_seq:
            return 0
        _apply(conn, latest)
        conn.execute("DELETE FROM entries_batches WHERE seq <= ?", (last_seq,))
        self.backlog = max(0, self.backlog - folded)
        self.folds += 1
        return folded

    def read(self, conn: sqlite3.Connection) -> Iterator[Row]:
        """Every stored row in write order: the table, then the log (later rows win)."""
        yield from conn.execute("SELECT key, value, expire_at, crc FROM entries ORDER BY rowid")
        self.backlog = 0
        for seq, blob, count, crc in conn.execute(
                "SELECT seq, records, count, crc FROM entries_batches ORDER BY seq"):
            if zlib.crc32(blob) != crc:
                raise DamagedBatch(seq)
            self.backlog += count
            for key, value, expire_at in decode_batch(blob):
                yield key, value, expire_at, None


def _apply(conn: sqlite3.Connection, latest: dict[bytes, tuple]) -> None:
    """Write the last state of each key into `entries` (a crc of None is computed here)."""
    conn.executemany(_DELETE, [(key,) for key, (value, _, _) in latest.items() if value is None])
    conn.executemany(_UPSERT, [(key, value, expire_at, zlib.crc32(value) if crc is None else crc)
                               for key, (value, expire_at, crc) in latest.items() if value is not None])
