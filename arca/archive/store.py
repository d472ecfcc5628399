"""The SQLite file under the archive directory: opening, locking, pragmas, schema and checks.

One `Store` per archive directory and per process: an exclusive lock file keeps a second
process (whose in-memory index would diverge) from opening the same directory. The database
runs in WAL mode; `synchronous` follows the durability mode, and `secure_delete` is FAST:
SQLite builds that default it to on (Debian's does) overwrite every page a statement frees
with zeros, and in WAL mode each such page is one more frame of the commit. The commit that
ends an L1 log rewrite frees the whole old log (64 MiB or more), so it wrote that much of
zeros into the WAL at once, past the WAL bound (see checkpoint.py). FAST still zeroes the
deleted cells on pages a commit writes anyway, and writes no page for that.

At open the file is checked (`PRAGMA quick_check` plus the schema version); a damaged file
raises `ArchiveCorruptError` naming the file and how to recover, and nothing is served from it.

A new database is built under a temporary name and renamed into place, so `archive.db`
is never empty on disk. An empty (0-byte) or missing `archive.db` beside a WAL that
holds pages, or an empty one alone, is therefore damage (a truncated or deleted file),
refused before SQLite opens it: SQLite would take it for a new database and throw the
WAL's pages away.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Callable, Iterator

from .checkpoint import CHECKPOINT_WAL_BYTES, RESTART_WAL_BYTES, WAL_HARD_BYTES, Checkpointer
from .config import ArchiveConfig
from .entry_log import create_batches_table
from .errors import ArchiveCorruptError, ArchiveError

log = logging.getLogger(__name__)

MIB = 1024 * 1024

SCHEMA_VERSION = 2
# The WAL file is truncated back to this size when it starts over after a checkpoint.
WAL_SIZE_LIMIT = RESTART_WAL_BYTES
# A commit waits this long for a lock (a RESTART checkpoint holds writers briefly).
BUSY_TIMEOUT_SECONDS = 30.0
# How long a commit that finds the WAL past WAL_HARD_BYTES waits for a checkpoint to start
# it over before failing; while commits fail that way, each retry waits only the second figure.
RESTART_WAIT_SECONDS = 5.0
RESTART_RETRY_WAIT_SECONDS = 0.1
# How often the checkpointer thread looks at the WAL.
CHECKPOINT_INTERVAL_SECONDS = 0.1


class WalBoundError(ArchiveError):
    """The WAL is past its bound and no checkpoint could start it over: the commit is refused."""

_SCHEMA_V1 = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    # rowid order is write order (INSERT OR REPLACE gives a replaced key a new rowid): the
    # LRU order is rebuilt from it at open.
    "CREATE TABLE entries (key BLOB NOT NULL UNIQUE, value BLOB NOT NULL, "
    "expire_at INTEGER, crc INTEGER NOT NULL)",
    # Version 1's row-per-write log; version 2 folds it and replaces it with entries_batches.
    "CREATE TABLE entries_log (seq INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB, "
    "expire_at INTEGER, crc INTEGER)",
    "CREATE TABLE corpus_streams (id INTEGER PRIMARY KEY, ns BLOB NOT NULL, "
    "tokens BLOB NOT NULL, crc INTEGER NOT NULL)",
    "CREATE TABLE kv_blocks (key BLOB NOT NULL UNIQUE, blob BLOB NOT NULL, "
    "size INTEGER NOT NULL, crc INTEGER NOT NULL)",
)



def _create_v1(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA_V1:
        conn.execute(statement)


# Step i upgrades the schema from version i to i + 1; append new steps, never edit old ones.
_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_create_v1, create_batches_table)


def is_corruption(error: sqlite3.Error) -> bool:
    """SQLite says the file is not a database or is malformed (rather than busy, full, ...)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


class Store:
    """The open database and its lock; owners run their SQL through `connection`."""

    def __init__(self, config: ArchiveConfig) -> None:
        self.path = config.database_path
        config.directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = _acquire_lock(config.directory / "archive.lock")
        try:
            self._check_files()
            if not self.path.exists():
                self._create(config)
            self.connection = self._open(config)
        except BaseException:
            self._lock_file.close()
            raise
        self._checkpointer = Checkpointer(self.path, CHECKPOINT_WAL_BYTES, CHECKPOINT_INTERVAL_SECONDS,
                                          RESTART_WAL_BYTES)
        self.forced_checkpoints = 0
        self._wal_refused = False  # the last commit was refused by the WAL bound

    def _open(self, config: ArchiveConfig) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=BUSY_TIMEOUT_SECONDS)
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot open archive database {self.path}: {error}") from error
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ArchiveError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous=" + ("FULL" if config.durability == "fsync" else "NORMAL"))
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute("PRAGMA cache_size=-16384")
            # Checkpoints run on their own thread (checkpoint.py), never inside a commit.
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            # Freed pages are not overwritten with zeros (see the module docstring): with
            # secure_delete on, a commit that frees N pages writes N more into the WAL.
            conn.execute("PRAGMA secure_delete=FAST")
            if config.verify_on_open:
                self._quick_check(conn)
            self._migrate(conn)
        except sqlite3.Error as error:
            conn.close()
            if is_corruption(error):
                raise ArchiveCorruptError(self.path, str(error)) from error
            raise ArchiveError(f"cannot open archive database {self.path}: {error}") from error
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_files(self) -> None:
        """Refuse an empty or missing database file that a WAL still needs, and an empty one."""
        wal = Path(f"{self.path}-wal")
        db_bytes, wal_bytes = _size(self.path), _size(wal)
        exists = self.path.exists()
        if exists and db_bytes > 0:
            return
        if wal_bytes > 0:
            state = "is empty (0 bytes)" if exists else "is missing"
            raise ArchiveCorruptError(
                self.path, f"the database file {state} while {wal.name} holds {wal_bytes} bytes of its pages",
                hint=f"the file was truncated or deleted: restore {self.path.name} from a copy, or, to "
                     f"start with an empty archive, stop every process using it and move "
                     f"{self.path.name}, {wal.name} and {self.path.name}-shm aside")
        if exists:
            raise ArchiveCorruptError(
                self.path, "the database file is empty (0 bytes); ARCA never leaves it so",
                hint=f"the file was truncated: restore it from a copy, or, if this archive never held "
                     f"data, delete {self.path.name} to start with an empty archive")

    def _create(self, config: ArchiveConfig) -> None:
        """Build a new, empty database (WAL mode, current schema) and rename it into place."""
        temporary = self.path.with_name(self.path.name + ".new")
        for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
            leftover.unlink(missing_ok=True)
        conn = sqlite3.connect(temporary, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            self._migrate(conn)
        finally:
            conn.close()  # the last connection checkpoints everything into the file
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _quick_check(self, conn: sqlite3.Connection) -> None:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(20)")]
        if problems != ["ok"]:
            raise ArchiveCorruptError(self.path, "; ".join(problems[:5]))

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ArchiveError(
                f"{self.path} has schema version {version}, newer than this reame understands "
                f"({SCHEMA_VERSION}); upgrade reame or point it at another directory")
        for step in range(version, SCHEMA_VERSION):
            with self.transaction(conn):
                _MIGRATIONS[step](conn)
                conn.execute(f"PRAGMA user_version={step + 1}")
            log.info("archive %s: schema migrated to version %d", self.path, step + 1)

    @contextlib.contextmanager
    def transaction(self, conn: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        conn = conn or self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            # A COMMIT that fails (a full disk) may leave the transaction open: end it, or
            # every later BEGIN would fail too.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as error:
                    log.debug("rollback after a failed transaction failed too: %s", error)
            raise

    def meta(self, name: str, default: int = 0) -> int:
        row = self.connection.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return default if row is None else int(row[0])

    def file_sizes(self) -> tuple[int, int]:
        """Bytes of the database file and of its write-ahead log."""
        return _size(self.path), _size(Path(f"{self.path}-wal"))

    def bound_wal(self) -> None:
        """Before a commit: checkpoint here (RESTART) if the WAL has passed WAL_HARD_BYTES,
        which only happens when the checkpointer thread cannot keep up or a reader pins the
        WAL (see checkpoint.py); raise WalBoundError if it cannot be started over in time."""
        size = self._checkpointer.wal_size()
        if size <= WAL_HARD_BYTES:
            self._wal_refused = False
            return
        # The background thread may be in a checkpoint of its own (then SQLite answers busy
        # at once): try again until it is done, holding this commit. A reader holding an old
        # snapshot makes the RESTART wait in SQLite's busy handler, given the time left.
        wait = RESTART_RETRY_WAIT_SECONDS if self._wal_refused else RESTART_WAIT_SECONDS
        deadline = time.monotonic() + wait
        conn = self.connection
        try:
            while True:
                left = deadline - time.monotonic()
                conn.execute(f"PRAGMA busy_timeout={max(1, int(left * 1000))}")
                if not conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]:
                    break
                if time.monotonic() >= deadline:
                    self._wal_refused = True
                    raise WalBoundError(
                        f"the WAL of {self.path} holds {size / MIB:.0f} MiB, past its bound of "
                        f"{WAL_HARD_BYTES / MIB:.0f} MiB, and no checkpoint could start it over within "
                        f"{wait:g} s (a reader holding an old snapshot, or a disk too slow for the "
                        "writes); the commit waits until one can")
                time.sleep(0.005)
        except sqlite3.Error as error:  # the commit itself will tell whether the disk is full
            log.debug("checkpoint before a commit failed: %s", error)
            return
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
        self._wal_refused = False
        self.forced_checkpoints += 1

    @property
    def checkpoints(self) -> int:
        return self._checkpointer.checkpoints

    @property
    def restart_checkpoints(self) -> int:
        return self._checkpointer.restarts + self.forced_checkpoints

    def close(self) -> None:
        try:
            self._checkpointer.stop()
            self.connection.close()  # the last connection to close checkpoints what is left
        finally:
            self._lock_file.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _acquire_lock(path: Path):
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ArchiveError(f"archive directory {path.parent} is in use by another process (pid {holder})") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
