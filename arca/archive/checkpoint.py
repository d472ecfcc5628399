"""WAL checkpoints on a thread of their own, and the bound that keeps the WAL finite.

In WAL mode every commit appends to `archive.db-wal`; a checkpoint copies those pages
into the database file and syncs it, which on a busy disk takes from tens of milliseconds
to seconds. SQLite's automatic checkpoint runs inside the commit that crosses the
threshold, i.e. on the thread serving clients, where it showed up as stalls of up to 2 s.
So the main connection has automatic checkpoints off and a `Checkpointer` thread, with a
connection of its own, runs `PRAGMA wal_checkpoint(PASSIVE)` whenever the WAL has grown
past `wal_bytes` (checked every `interval` seconds). A passive checkpoint takes no lock
that writers need: commits go on while it copies. The WAL starts over from its beginning
only when a commit finds every frame in it copied.

Under sustained writes that never happens: a passive checkpoint copies the frames that
were in the log when it started, and the commits made while it copied are there when it
ends, so the log is never wholly copied and grows by every byte written (15 MB/s under
mixed L1/L4/L3 writes). (The pragma's "frames copied" equals its "frames in the log" then:
both count the log as it was when the checkpoint started, so comparing them says nothing.)
So whenever the log held more than `restart_bytes` when a passive checkpoint started, the
thread follows it at once with `wal_checkpoint(RESTART)`, which holds writers while it
copies what the passive one left (the commits of a fraction of a second) and starts the
log over; `journal_size_limit` then trims the file at the next commit. The WAL file thus
stays near `restart_bytes` plus the writes of one checkpoint's duration.

`Store.bound_wal` is the backstop on the committing thread, for a disk too slow for the
thread or a reader (another process) holding an old snapshot: a WAL past
`WAL_HARD_BYTES` is checkpointed (RESTART) before the next commit, waiting up to
`RESTART_WAIT_SECONDS`; if it still cannot start over, the commit fails (the server then
refuses writes and retries, as on a full disk) rather than append past the bound. So the
WAL file never exceeds WAL_HARD_BYTES plus the writes of one commit (the pages of its rows:
the pages it frees are not zeroed into the WAL, see store.py).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# A passive checkpoint starts once the WAL file holds this much...
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024
# ...a RESTART checkpoint follows one that found this much in the log...
RESTART_WAL_BYTES = 64 * 1024 * 1024
# ...and the committing thread itself checkpoints a WAL past this size (the stated bound).
WAL_HARD_BYTES = 128 * 1024 * 1024
# The thread's RESTART holds writers while it waits for readers: at most this long, and after
# one that could not finish (a reader holding an old snapshot) the next waits this long.
RESTART_BUSY_SECONDS = 0.5
RESTART_BACKOFF_SECONDS = 2.0


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
        self._restart_not_before = 0.0
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
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False,
                                   timeout=RESTART_BUSY_SECONDS)
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
            _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            if frames * page_size >= self._restart_bytes and time.monotonic() >= self._restart_not_before:
                # Commits went on while it copied, so the log is not wholly copied and will
                # not start over by itself: copy the rest while holding them, and start it over.
                if conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]:
                    self._restart_not_before = time.monotonic() + RESTART_BACKOFF_SECONDS
                else:
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
