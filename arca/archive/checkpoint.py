"""WAL checkpoints on a thread of their own, so the event loop never waits for one.

In WAL mode every commit appends to `archive.sqlite3-wal`; a checkpoint copies those pages
into the database file and syncs it, which on a busy disk takes from tens of milliseconds
to seconds. SQLite's automatic checkpoint runs inside the commit that crosses the
threshold, i.e. on the thread serving clients, where it showed up as stalls of up to 2 s.
So the main connection has automatic checkpoints off and a `Checkpointer` thread, with a
connection of its own, runs `PRAGMA wal_checkpoint(PASSIVE)` whenever the WAL has grown
past `wal_bytes` (checked every `interval` seconds). A passive checkpoint takes no lock
that writers need: commits go on while it copies. When it has copied everything, the
next commit starts the WAL over from its beginning, so the file stops growing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, path: Path, wal_bytes: int = 16 * 1024 * 1024, interval: float = 0.25) -> None:
        self._path = path
        self._wal_path = Path(f"{path}-wal")
        self._wal_bytes = wal_bytes
        self._interval = interval
        self._stop = threading.Event()
        self.checkpoints = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="arca-checkpoint", daemon=True)
        self._thread.start()

    def _wal_size(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        conn = None
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA wal_autocheckpoint=0")
            while not self._stop.wait(self._interval):
                if self._wal_size() >= self._wal_bytes:
                    self.checkpoint(conn)
        except sqlite3.Error as error:
            log.error("WAL checkpoints stopped: %s (the WAL keeps growing until restart)", error)
        finally:
            if conn is not None:
                conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
        except sqlite3.Error as error:  # a full disk, say: try again next time
            self.failures += 1
            log.warning("WAL checkpoint of %s failed: %s", self._path, error)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
