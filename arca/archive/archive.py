"""The Archive facade: one directory, one SQLite file, L1 entries + L4 corpus + L3 KV blocks.

All methods are synchronous and fast (dict and array work; no I/O except `commit`, `close`,
`kv_get` and opening). One thread at a time uses an Archive; it may be a different thread
from the one that opened it.
"""

from __future__ import annotations

import logging
import os
import resource
import sqlite3
import sys
from typing import Iterator, Sequence

from .config import ArchiveConfig
from .corpus import DEFAULT_NAMESPACE, Corpus
from .entries import Entries, Entry
from .errors import ArchiveCorruptError, ArchiveError
from .journal import GroupCommit
from .kvblocks import KVBlocks
from .store import Store, WalBoundError
from .watch import Watcher

log = logging.getLogger(__name__)

InfoSections = dict[str, dict[str, "int | float | str"]]
_COUNTERS = ("hits", "misses", "evicted", "expired")  # L1 table counters CONFIG RESETSTAT zeroes
# OBJECT ENCODING hints (the L1 table's): a value named by its bytes (what every write
# stores), raw (modified in place by APPEND, SETRANGE, SETBIT), a string never int (INCRBYFLOAT).
ENCODING_SHAPE, ENCODING_RAW, ENCODING_STRING = 0, 1, 2


class Archive:
    def __init__(self, config: ArchiveConfig) -> None:
        self.config = config
        self._store = Store(config)
        self._closed = False
        try:
            self._entries = Entries(config.max_bytes)
            self._entries.load(self._store.connection, self._store.path)
            self._corpus = Corpus(config)
            self._corpus.load(self._store.connection, self._store.path, self._store.meta("next_stream_id", 1))
            self._kv = KVBlocks(config.kv_max_bytes)
            self._kv.load(self._store.connection)
            self._journal = GroupCommit(self._store, (self._entries, self._corpus, self._kv))
        except BaseException:
            self._store.close()
            raise
        # The hottest calls go straight to the part that serves them (one call frame less):
        # deliberately rebound on the instance, with the signatures of the methods below.
        self.get = self._entries.table.get  # type: ignore[method-assign]  # the C table's get
        self.put = self._entries.put  # type: ignore[method-assign]  # Entries.put itself
        self.get_with_deadline = self._entries.table.get_with_deadline  # type: ignore[method-assign]  # the C table's
        self.run_plain = self._entries.table.run  # type: ignore[method-assign]  # the C table's run
        self._counters_base = dict.fromkeys(_COUNTERS, 0)  # the counters at CONFIG RESETSTAT
        log.info("archive open at %s: %d keys, %d corpus streams, %d KV blocks", config.database_path,
                 len(self._entries), self._corpus.stats()["corpus_streams"], len(self._kv))

    # -- L1 --------------------------------------------------------------------------------

    # Positional-only, as the C functions that replace get, get_with_deadline and run_plain.
    def get(self, key: bytes, /) -> bytes | None:
        return self._entries.get(key)

    def get_entry(self, key: bytes) -> Entry | None:
        return self._entries.get_entry(key)

    def get_with_deadline(self, key: bytes, /) -> tuple[bytes, int | None] | None:
        """(value, expire_at_ms or None) or None; get_entry without building an Entry."""
        return self._entries.get_with_deadline(key)

    def peek(self, key: bytes) -> tuple[bytes, int | None] | None:
        """get_with_deadline that leaves the key's place in the LRU order: a read counted as
        a keyspace hit or miss, as Redis counts TTL, TYPE, EXISTS and OBJECT, without the
        touch those leave out."""
        return self._entries.table.peek_with_deadline(key)

    def get_for_update(self, key: bytes, *, touch: bool = True) -> tuple[bytes, int | None] | None:
        """get_with_deadline for a command about to write the key (SETRANGE, EXPIRE, ...):
        not counted as a keyspace hit or miss, as Redis counts only reads. `touch=False`
        also leaves the key's LRU place (MEMORY USAGE)."""
        table = self._entries.table
        found = table.get_with_deadline(key) if touch else table.peek_with_deadline(key)
        self._counters_base["hits" if found is not None else "misses"] += 1
        return found

    def put(self, key: bytes, value: bytes, expire_at_ms: int | None = None) -> None:
        self._entries.put(key, value, expire_at_ms)

    def put_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """Set every (key, value) without a TTL; nothing is set when one is over the budget."""
        self._entries.put_many(pairs)

    def run_plain(self, data: bytes, resp: int, out_cap: int, max_bulk: int,
                  max_items: int = 1 << 20, /) -> tuple[bytes, int, int, bytes | None]:
        """Answer the leading pipelined plain commands of a read (RESP bytes: GET, SET key
        value, MGET, MSET, INCR and the like, PING) in one call: (replies, bytes consumed,
        commands run, last command name). Stops at anything else and at anything that would
        answer an error; see _l1table.c."""
        return self._entries.table.run(data, resp, out_cap, max_bulk, max_items)

    def delete(self, key: bytes) -> bool:
        return self._entries.delete(key)

    def exists(self, key: bytes) -> bool:
        return self._entries.exists(key)

    def set_expire(self, key: bytes, expire_at_ms: int | None) -> bool:
        return self._entries.set_expire(key, expire_at_ms)

    def scan(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        return self._entries.scan(cursor, count)

    def keys(self) -> Iterator[bytes]:
        return self._entries.keys()

    def random_key(self) -> bytes | None:
        return self._entries.random_key()

    def dbsize(self) -> int:
        self._entries.expire_due()
        return len(self._entries)

    def flush(self) -> None:
        self._entries.flush()

    # -- WATCH ---------------------------------------------------------------------------

    def watch(self, watcher: Watcher, keys: Sequence[bytes]) -> None:
        """Watch `keys` for `watcher` (see watch.py); commits first when one of them has a
        change not committed yet, so that its next change is seen."""
        for key in keys:
            self._entries.exists(key)  # a key already past its deadline goes now: not a change
        if self._entries.watches.needs_commit(keys):
            self.commit()
        self._entries.watches.add(watcher, keys)

    def unwatch(self, watcher: Watcher) -> None:
        self._entries.watches.remove(watcher)

    def watch_changed(self, watcher: Watcher) -> bool:
        """Whether a key `watcher` watches changed, was deleted or expired since WATCH."""
        return self._entries.watches.changed(watcher)

    def expire_cycle(self, limit: int = 1000) -> int:
        """Active expiry: drop up to `limit` keys past their deadline; returns how many.

        `commit()` runs it too; a server with idle periods may call it a few times a second.
        """
        return self._entries.expire_due(limit)

    # -- L4 corpus ---------------------------------------------------------------------------

    def observe(self, ns: bytes, packed_tokens: bytes) -> int:
        """Store one finished generation (packed u32 LE); returns its stream id."""
        return self._corpus.observe(ns or DEFAULT_NAMESPACE, packed_tokens)

    def draft(self, ns: bytes, tail: Sequence[int], k: int) -> list[int] | None:
        """Up to k tokens that followed the longest matching suffix of `tail`, or None."""
        return self._corpus.draft(ns or DEFAULT_NAMESPACE, tail, k)

    def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]]:
        """Streams of `ns` with id > cursor, oldest first: (stream id, packed tokens)."""
        return self._corpus.since(ns or DEFAULT_NAMESPACE, cursor, count)

    # -- L3 KV blocks ----------------------------------------------------------------------

    def kv_put(self, key: bytes, blob: bytes) -> bool:
        return self._kv.put(key, blob)

    def kv_get(self, key: bytes) -> bytes | None:
        return self._kv.get(self._store.connection, key)

    def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        return self._kv.exists(keys)

    # -- durability ------------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return self._entries.pending_writes + self._corpus.pending_writes + self._kv.pending_writes

    @property
    def pending_queues(self) -> tuple:
        """Containers that are all empty exactly when no write is pending: `any(queues)` is
        the cheapest test (the server asks after every batch of replies)."""
        return self._journal.pending_queues

    def commit(self) -> None:
        self._entries.expire_due(200)
        self._journal.commit()

    def compact(self) -> int:
        """Commit, then rewrite the whole L1 log so it holds each live key once (before
        copying the file, say); returns the number of log records it held before."""
        self.commit()
        return self._maintain(self._entries.compact)

    @property
    def log_records(self) -> int:
        """Records in the L1 log (see entry_log.py)."""
        return self._entries.log.records

    def maintenance_due(self) -> bool:
        """Whether idle time should go to maintenance_step (a rewrite of the L1 log)."""
        return self._entries.maintenance_due()

    def maintenance_step(self) -> bool:
        """One small step of log maintenance (a few ms), for idle time; True while there is
        more to do."""
        return bool(self._maintain(self._entries.maintenance_step))

    def _maintain(self, step) -> int:
        try:
            self._store.bound_wal()
        except WalBoundError:
            return 0  # maintenance waits, like commits, until the WAL can start over
        try:
            with self._store.transaction() as conn:
                return step(conn)
        except sqlite3.Error as error:
            self._entries.rolled_back()
            raise ArchiveError(f"L1 log maintenance in {self._store.path} failed: {error}") from error

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._journal.commit()
        finally:
            self._closed = True
            self._store.close()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- introspection ---------------------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        """The L1 budget in bytes (key + value + ENTRY_OVERHEAD per entry)."""
        return self._entries.table.max_bytes

    @max_bytes.setter
    def max_bytes(self, budget: int) -> None:
        """A new L1 budget; entries past it are evicted, least recently used first, as the
        next writes need room (a smaller budget frees nothing until then)."""
        self._entries.table.max_bytes = budget

    def encoding(self, key: bytes) -> int | None:
        """How OBJECT ENCODING names the key's value: ENCODING_SHAPE (by its bytes),
        ENCODING_RAW or ENCODING_STRING (never int); None without the key. No side effects."""
        return self._entries.table.encoding(key)

    def idle_seconds(self, key: bytes) -> int | None:
        """Seconds since the key was last read or written (not counting TTL, TYPE, EXISTS,
        OBJECT, MEMORY USAGE), from when it was loaded after a restart; None without it."""
        return self._entries.table.idle(key)

    def set_encoding(self, key: bytes, hint: int) -> bool:
        """Give the key's value an encoding hint (kept in RAM only, until its next write)."""
        return self._entries.table.set_encoding(key, hint)

    def plain_calls(self) -> tuple[int, ...]:
        """How many GET, SET, PING, MGET, MSET, INCR, DECR, INCRBY, DECRBY run_plain has
        answered, in that order."""
        return self._entries.table.plain_calls

    def reset_stats(self) -> None:
        """Start the L1 counters INFO reports (hits, misses, evicted, expired) from zero."""
        table = self._entries.table
        self._counters_base = {name: getattr(table, name) for name in _COUNTERS}

    def info(self) -> InfoSections:
        entries, journal = self._entries, self._journal
        table = entries.table  # the L1 counters
        counters = {name: getattr(table, name) - base for name, base in self._counters_base.items()}
        db_bytes, wal_bytes = self._store.file_sizes()
        maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "memory": {
                "used_memory_rss": _rss_bytes(),
                "used_memory_peak": maxrss_kb * 1024 if sys.platform != "darwin" else maxrss_kb,
                "l1_used_bytes": table.used_bytes,
                "maxmemory": table.max_bytes,
                "maxmemory_policy": "allkeys-lru",
                "evicted_keys": counters["evicted"],
                "expired_keys": counters["expired"],
            },
            "persistence": {
                "durability": self.config.durability,
                "database": str(self._store.path),
                "database_bytes": db_bytes,
                "wal_bytes": wal_bytes,
                "pending_writes": journal.pending_writes,
                "commits": journal.commits,
                "wal_checkpoints": self._store.checkpoints,
                "wal_restart_checkpoints": self._store.restart_checkpoints,
                "commit_failures": journal.failures,
                "last_commit_us": journal.last_commit_us,
                "last_commit_time": journal.last_commit_unix,
                "log_records": entries.log.records,
                "log_rewrites": entries.log.rewrites,
                "log_rewriting": int(entries.log.rewriting),
            },
            "keyspace": _keyspace(len(table), table.ttl_count),
            "arca": {
                "keyspace_hits": counters["hits"],
                "keyspace_misses": counters["misses"],
                **self._corpus.stats(),
                **self._kv.stats(),
            },
        }


def _keyspace(keys: int, expires: int) -> dict[str, int | float | str]:
    return {"db0": f"keys={keys},expires={expires},avg_ttl=0"} if keys else {}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
