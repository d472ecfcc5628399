"""Folding the L1 entry log on a thread of its own (see entry_log.py for what folding is).

Folding a slice of 1024 records costs 10-25 ms of SQLite work (random keys dirty most
pages of the keyed table); on the thread serving clients that is a stall per slice. The
`LogFolder` thread, with a connection of its own, folds one slice per write transaction
whenever folding is wanted: while the owner says it is idle (the RESP server says so after
100 ms without a command, see `Archive.set_idle`), back to back; and while the log holds
more than `fold_after` records whatever the owner says (writes with no idle time at all),
then a quarter of the time, so that commits seldom wait.

Commits and folds share the database's one write lock through `Store.transaction`, so a
commit waits at most for the slice being folded; after each slice the folder yields the
lock for a moment so a waiting commit goes first. Nothing here changes what is durable: a
fold moves records from the log to the keyed table inside one transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from .entry_log import DamagedBatch, EntryLog
from .store import Store

log = logging.getLogger(__name__)

# Page cache of the folder's connection, KiB.
CACHE_KIB = 16384
# After a failed fold (a full disk, say) the folder waits this long before trying again.
RETRY_SECONDS = 1.0
# After each slice the folder leaves the write lock free this long for a waiting commit...
YIELD_SECONDS = 0.002
# ...or, while the owner is busy, this many times as long as the slice took.
BUSY_PAUSE_FACTOR = 3.0


class LogFolder:
    def __init__(self, store: Store, entry_log: EntryLog) -> None:
        self._store = store
        self._log = entry_log
        self.status = "ok"  # for INFO persistence
        self._idle = threading.Event()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="arca-fold", daemon=True)
        self._thread.start()

    def set_idle(self, idle: bool) -> None:
        """The owner has (True) or has not (False) been idle lately; folding waits for idle
        time unless the log is over its bound."""
        if idle:
            self._idle.set()
            self._wake.set()
        else:
            self._idle.clear()

    def log_grew(self) -> None:
        """A commit appended to the log: fold now if it is over its bound."""
        if self._log.backlog > self._log.fold_after:
            self._wake.set()

    def _wanted(self) -> bool:
        backlog = self._log.backlog
        return backlog > 0 and (self._idle.is_set() or backlog > self._log.fold_after)

    def _run(self) -> None:
        conn = sqlite3.connect(self._store.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA wal_autocheckpoint=0")
            # A fold moves records inside one transaction: losing the last folds to a power
            # cut loses nothing (their log batches come back with them), so no fsync per
            # fold (SQLite's default, FULL, halves the fold rate).
            conn.execute("PRAGMA synchronous=NORMAL")
            # Folding touches pages all over the keyed table: the main connection's page
            # cache size rather than SQLite's 2 MiB default.
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            while not self._stopping:
                self._wake.wait(0.5)
                self._wake.clear()
                while self._wanted() and not self._stopping:
                    started = time.perf_counter()
                    if not self._fold_slice(conn):
                        break
                    # Idle: fold on. Busy (the log is over its bound): fold a quarter of
                    # the time, so commits rarely find the lock taken.
                    spent = time.perf_counter() - started
                    time.sleep(YIELD_SECONDS if self._idle.is_set() else BUSY_PAUSE_FACTOR * spent)
        finally:
            conn.close()

    def _fold_slice(self, conn: sqlite3.Connection) -> bool:
        try:
            with self._store.transaction(conn):
                self._log.fold(conn, self._log.fold_slice)
        except DamagedBatch as exc:
            log.error("L1 log batch %d fails its checksum; folding stopped (the archive reports it at open)",
                      exc.args[0])
            self.status = f"stopped: log batch {exc.args[0]} fails its checksum"
            self._stopping = True
            return False
        except sqlite3.Error as error:
            log.warning("folding the L1 log failed: %s; the log is kept and folding retried", error)
            self.status = f"retrying: {error}"
            time.sleep(RETRY_SECONDS)
            return False
        self.status = "ok"
        return True

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()
