"""WAL checkpoints on a thread of their own, and the bound that keeps the WAL finite.

In WAL mode every commit appends to `archive.db-wal`; a checkpoint copies those pages
into the database file and syncs it, which on a busy disk takes from tens of milliseconds
to seconds. SQLite's automatic checkpoint runs inside the commit that crosses the
threshold, i.e. on the thread serving clients, where it showed up as stalls of up to 2 s.
So the main connection has automatic checkpoints off and a `Checkpointer` thread, with a
connection of its own, runs `PRAGMA wal_checkpoint(PASSIVE)` whenever the WAL has grown
past `wal_bytes` (checked every `interval` seconds). A passive checkpoint takes no lock
that writers need: commits go on while it copies. When it has copied everything, the
next commit starts the WAL over from its beginning, so the file stops growing.

Under sustained writes a passive checkpoint never catches up: commits keep appending
while it copies, so it never copies everything and the WAL never starts over (it grew
by 15 MB/s, without end, under mixed L1/L4/L3 writes). So when a passive checkpoint
ends with more than `restart_bytes` still in the log, the thread follows it at once
with `wal_checkpoint(RESTART)`, which holds writers while it copies what the passive one
left (the commits of a fraction of a second) and makes the next commit start the WAL
over. `journal_size_limit` then trims the file back. `Store.bound_wal` is the backstop
on the committing thread: a WAL past `WAL_HARD_BYTES` is checkpointed (RESTART) before
the next commit, whatever the thread is doing. Together: the WAL file stays below
WAL_HARD_BYTES plus the writes of one commit.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# A passive checkpoint starts once the WAL file holds this much...
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024
# ...a RESTART checkpoint follows one that left this much behind...
RESTART_WAL_BYTES = 64 * 1024 * 1024
# ...and the committing thread itself checkpoints a WAL past this size (the stated bound).
WAL_HARD_BYTES = 128 * 1024 * 1024


class Checkpointer:
    def __init__(self, path: Path, wal_bytes: int = CHECKPOINT_WAL_BYTES, interval: float = 0.1,
                 restart_bytes: int = RESTART_WAL_BYTES) -> None:
        self._path = path
        self._wal_path = Path(f"{path}-wal")
        self._wal_bytes = wal_bytes
        self._restart_bytes = restart_bytes
        self._interval = interval
        self._stop = threading.Event()
        self.checkpoints = 0
        self.restarts = 0
        self.failures = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="arca-checkpoint", daemon=True)
        self._thread.start()

    def wal_size(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        conn = None
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA wal_autocheckpoint=0")
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            while not self._stop.wait(self._interval):
                if self.wal_size() >= self._wal_bytes:
                    self.checkpoint(conn, page_size)
        except sqlite3.Error as error:
            log.error("WAL checkpoints stopped: %s (the WAL keeps growing until restart)", error)
        finally:
            if conn is not None:
                conn.close()

    def checkpoint(self, conn: sqlite3.Connection, page_size: int = 4096) -> None:
        try:
            _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            if copied < frames and frames * page_size >= self._restart_bytes:
                # Writers outran it: copy the rest while holding them, so the WAL starts over.
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                self.restarts += 1
        except sqlite3.Error as error:  # a full disk, say: try again next time
            self.failures += 1
            if not self._failing:  # once, not every interval while it lasts
                log.warning("WAL checkpoint of %s failed: %s (retried until it succeeds)", self._path, error)
            self._failing = True
            return
        if self._failing:
            log.info("WAL checkpoints of %s succeed again", self._path)
            self._failing = False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
