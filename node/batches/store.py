"""Batches, files and per-line progress in SQLite, file contents on disk, on a thread of its own.

Layout under `[batch] directory` (default `<home>/batches`): `batches.db` (tables `files`,
`batches`, `lines`) and `files/<id>`, the bytes of every uploaded input and every output
or error file. A file is written under `tmp/`, renamed into `files/` and only then given its
row, so a crash leaves at most an orphan, deleted at the next open (as are uploads that
never finished). Every result of a line is committed in the transaction that counts it
(`finish_line`, guarded by `done = 0`), so a restarted node knows exactly which lines are
finished and never runs one of them again. `finalize` writes the output file (successful
lines) and the error file (failed lines) in input order and drops the lines' rows in one
transaction. WAL with synchronous=NORMAL: a killed process loses no committed line.

Budgets: an upload over `max_file_bytes` is refused (413), as is one that would take all
stored files past `max_storage_bytes` (507). The results of running batches count too, from
the moment they are committed: a result that would pass the budget is refused
(`StorageFull`) and its batch fails (`fail_running`: its lines and results dropped, the node
goes on). When a batch ends its rows are deleted, the WAL is checkpointed and truncated and a
database with much free space is rewritten (VACUUM), so the disk gets the space back. Blocking calls run on the
store's one thread through `call()`; the event loop never waits on SQLite or the disk.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import orjson

from node.batches.errors import FileTooLarge, StorageFull, TooManyFiles
from node.batches.lines import InputLine

T = TypeVar("T")
WINDOW_S = 24 * 3600
WAL_LIMIT = 16 << 20  # bytes a checkpointed WAL keeps
COMPACT_BYTES = 16 << 20  # free pages past this: the database is rewritten once a batch ends
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL, owner TEXT NOT NULL DEFAULT '', tenant TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, input_file_id TEXT NOT NULL, endpoint TEXT NOT NULL, completion_window TEXT NOT NULL,
    status TEXT NOT NULL, created_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    expires_at INTEGER, metadata TEXT, errors TEXT, total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT, error_file_id TEXT, tenant TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
    body BLOB NOT NULL, done INTEGER NOT NULL DEFAULT 0, ok INTEGER, result BLOB,
    PRIMARY KEY (batch_id, line)) WITHOUT ROWID;
"""
TIMESTAMPS = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "cancelling_at",
              "cancelled_at", "expires_at")


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int

    def to_object(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": None, "status_details": None}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    row: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def status(self) -> str:
        return str(self.row["status"])

    def to_object(self) -> dict[str, Any]:
        row = self.row
        return {
            "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
            "errors": orjson.loads(row["errors"]) if row["errors"] else None,
            "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
            "status": row["status"], "output_file_id": row["output_file_id"], "error_file_id": row["error_file_id"],
            **{name: row[name] for name in TIMESTAMPS}, "expired_at": None,
            "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
            "metadata": orjson.loads(row["metadata"]) if row["metadata"] else None,
        }


class Upload:
    """One file being received: bytes go to a temp file, counted against both budgets."""

    def __init__(self, store: "BatchStore", path: Path, owner: str = "", tenant: str = "") -> None:
        self.store = store
        self.path = path
        self.owner = owner
        self.tenant = tenant
        self.size = 0
        self.handle = open(path, "wb")

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.store.max_file_bytes:
            raise FileTooLarge(f"The file is over the limit of {self.store.max_file_bytes} bytes "
                               f"([batch] max_file_mb)", param="file")
        await self.store.call(self.handle.write, chunk)

    async def commit(self, filename: str, purpose: str, check: Callable[[Path], None] | None = None) -> FileRecord:
        """Store it once `check(path)` passed (on a thread of its own: reading the whole file must
        not hold the store's thread)."""
        await self.store.call(self.handle.close)
        if check is not None:
            await asyncio.to_thread(check, self.path)
        return await self.store.call(self.store.add_file, self.path, filename, purpose, self.owner, self.tenant)

    async def abort(self) -> None:
        await self.store.call(self._discard)

    def _discard(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)


class BatchStore:
    def __init__(self, directory: Path, *, max_file_bytes: int, max_storage_bytes: int,
                 max_files_per_owner: int = 0) -> None:
        self.directory = directory
        self.max_files_per_owner = max_files_per_owner  # uploads one client may keep; 0: no bound
        self.max_file_bytes = max_file_bytes
        self.max_storage_bytes = max_storage_bytes
        self.files_dir = directory / "files"
        self.tmp_dir = directory / "tmp"
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reame-batches")
        self._db: sqlite3.Connection | None = None
        self._results = 0  # bytes of line results in the database, not yet in output files

    @classmethod
    def open(cls, directory: Path, *, max_file_bytes: int, max_storage_bytes: int,
             max_files_per_owner: int = 0) -> "BatchStore":
        """Blocking: create or open the database and clear what a crash left behind."""
        store = cls(directory, max_file_bytes=max_file_bytes, max_storage_bytes=max_storage_bytes,
                    max_files_per_owner=max_files_per_owner)
        store._thread.submit(store._open).result()
        return store

    def _open(self) -> None:
        for path in (self.directory, self.files_dir, self.tmp_dir):
            path.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.directory / "batches.db", isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")  # a checkpointed WAL is cut back to this
        db.executescript(SCHEMA)
        if "owner" not in {row[1] for row in db.execute("PRAGMA table_info(files)")}:  # a store of an older node
            db.execute("ALTER TABLE files ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
        for table in ("files", "batches"):  # the tenant (node/serving/tenants.py) each row belongs to
            if "tenant" not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
        self._db = db
        self._results = int(db.execute("SELECT COALESCE(SUM(LENGTH(result)), 0) FROM lines WHERE done = 1")
                            .fetchone()[0])
        for leftover in self.tmp_dir.iterdir():
            leftover.unlink(missing_ok=True)
        known = {row[0] for row in db.execute("SELECT id FROM files")}
        for path in self.files_dir.iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "the store is not open"
        return self._db

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        self._thread.submit(shut).result()
        self._thread.shutdown()

    # -- files --------------------------------------------------------------------------------

    async def begin_upload(self, owner: str = "", tenant: str = "") -> Upload:
        """An upload of `owner` (who sends it) for `tenant` (whose key); StorageFull past the byte
        budget, TooManyFiles when the owner keeps `max_files_per_owner` uploads already."""
        used, held = await self.call(lambda: (self.stored_bytes(), self.files_of(owner)))
        if used >= self.max_storage_bytes:
            raise StorageFull(f"Stored files already take {used} bytes of the {self.max_storage_bytes} allowed "
                              f"([batch] max_storage_mb); delete some with DELETE /v1/files/{{id}}")
        if 0 < self.max_files_per_owner <= held:
            raise TooManyFiles(f"This client already keeps {held} uploaded files, the most one client may "
                               f"([batch] max_files_per_client); delete some with DELETE /v1/files/{{id}}")
        return await self.call(lambda: Upload(self, self.tmp_dir / uuid.uuid4().hex, owner, tenant))

    def files_of(self, owner: str) -> int:
        """Uploads `owner` keeps (output files are not counted)."""
        return int(self.db.execute("SELECT COUNT(*) FROM files WHERE owner = ? AND purpose = 'batch'",
                                   (owner,)).fetchone()[0])

    def stored_bytes(self) -> int:
        """Bytes the budget counts: every stored file and the results not yet written to one."""
        return int(self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files").fetchone()[0]) + self._results

    def add_file(self, source: Path, filename: str, purpose: str, owner: str = "", tenant: str = "") -> FileRecord:
        size = source.stat().st_size
        if purpose == "batch" and 0 < self.max_files_per_owner <= self.files_of(owner):  # uploads side by side
            source.unlink(missing_ok=True)
            raise TooManyFiles(f"This client already keeps {self.max_files_per_owner} uploaded files, the most "
                               f"one client may ([batch] max_files_per_client); delete some with DELETE /v1/files/{{id}}")
        if purpose == "batch" and self.stored_bytes() + size > self.max_storage_bytes:
            source.unlink(missing_ok=True)
            raise StorageFull(f"Storing {size} more bytes would pass the budget of {self.max_storage_bytes} "
                              f"bytes ([batch] max_storage_mb)")
        record = FileRecord(f"file-{uuid.uuid4().hex[:24]}", filename, purpose, size, int(time.time()))
        os.replace(source, self.files_dir / record.id)
        self.db.execute("INSERT INTO files (id, filename, purpose, bytes, created_at, owner, tenant) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (record.id, record.filename, record.purpose, record.bytes, record.created_at, owner, tenant))
        return record

    # `tenant` below: only that tenant's rows (what the routes ask); None: any (the runner's own use)

    def get_file(self, file_id: str, tenant: str | None = None) -> FileRecord | None:
        where, args = _scoped(tenant)
        row = self.db.execute(f"SELECT id, filename, purpose, bytes, created_at FROM files WHERE id = ?{where}",
                              (file_id, *args)).fetchone()
        return FileRecord(*row) if row is not None else None

    def list_files(self, purpose: str | None, limit: int, after: str | None,
                   tenant: str | None = None) -> list[FileRecord]:
        """Newest first; `after` an id: the files older than it."""
        query, args = "SELECT id, filename, purpose, bytes, created_at FROM files", []
        where = []
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        if after:
            where.append("rowid < (SELECT rowid FROM files WHERE id = ?)")
            args.append(after)
        if where:
            query += " WHERE " + " AND ".join(where)
        rows = self.db.execute(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit)).fetchall()
        return [FileRecord(*row) for row in rows]

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def delete_file(self, file_id: str) -> bool:
        deleted = self.db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0
        if deleted:
            self.file_path(file_id).unlink(missing_ok=True)
        return deleted

    # -- batches -------------------------------------------------------------------------------

    def create_batch(self, input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None,
                     tenant: str = "") -> BatchRecord:
        """`tenant`: whose key created it (node/serving/tenants.py): its lines use that tenant's caches."""
        now = int(time.time())
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        self.db.execute(
            "INSERT INTO batches (id, input_file_id, endpoint, completion_window, status, created_at, expires_at, "
            "metadata, tenant) VALUES (?, ?, ?, ?, 'validating', ?, ?, ?, ?)",
            (batch_id, input_file_id, endpoint, window, now, now + WINDOW_S,
             orjson.dumps(metadata).decode() if metadata is not None else None, tenant))
        return self._batch(batch_id)

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        where, args = _scoped(tenant)
        row = self.db.execute(f"SELECT * FROM batches WHERE id = ?{where}", (batch_id, *args)).fetchone()
        return BatchRecord(dict(row)) if row is not None else None

    def _batch(self, batch_id: str) -> BatchRecord:
        batch = self.get_batch(batch_id)
        assert batch is not None
        return batch

    def list_batches(self, limit: int, after: str | None, tenant: str | None = None) -> list[BatchRecord]:
        query, args = "SELECT * FROM batches WHERE 1", []
        if tenant is not None:
            query += " AND tenant = ?"
            args.append(tenant)
        if after:
            query += " AND rowid < (SELECT rowid FROM batches WHERE id = ?)"
            args.append(after)
        rows = self.db.execute(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit)).fetchall()
        return [BatchRecord(dict(row)) for row in rows]

    def active_batches(self) -> list[str]:
        """Batches with work left, oldest first."""
        marks = ", ".join("?" * len(ACTIVE))
        return [row[0] for row in self.db.execute(
            f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY rowid", ACTIVE)]

    def start_batch(self, batch_id: str, lines: Iterable[InputLine]) -> BatchRecord:
        """validating -> in_progress with its lines (a batch cancelled meanwhile stays cancelled)."""
        db = self.db
        with _transaction(db):
            if self._batch(batch_id).status != "validating":
                return self._batch(batch_id)
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.executemany("INSERT INTO lines (batch_id, line, custom_id, url, body) VALUES (?, ?, ?, ?, ?)",
                           ((batch_id, line.number, line.custom_id, line.url, line.body) for line in lines))
            total = db.execute("SELECT COUNT(*) FROM lines WHERE batch_id = ?", (batch_id,)).fetchone()[0]
            db.execute("UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ? WHERE id = ?",
                       (int(time.time()), total, batch_id))
        return self._batch(batch_id)

    def fail_batch(self, batch_id: str, errors: list[dict[str, Any]]) -> BatchRecord:
        self.db.execute("UPDATE batches SET status = 'failed', failed_at = ?, errors = ? "
                        "WHERE id = ? AND status = 'validating'",
                        (int(time.time()), orjson.dumps({"object": "list", "data": errors}).decode(), batch_id))
        return self._batch(batch_id)

    def request_cancel(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        """validating -> cancelled at once; in_progress -> cancelling; anything else unchanged."""
        if self.get_batch(batch_id, tenant) is None:
            return None
        now = int(time.time())
        db = self.db
        with _transaction(db):
            db.execute("UPDATE batches SET status = 'cancelled', cancelling_at = ?, cancelled_at = ? "
                       "WHERE id = ? AND status = 'validating'", (now, now, batch_id))
            db.execute("UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                       "WHERE id = ? AND status = 'in_progress'", (now, batch_id))
        return self.get_batch(batch_id)

    def pending_lines(self, batch_id: str, after: int, limit: int) -> list[InputLine]:
        rows = self.db.execute("SELECT line, custom_id, url, body FROM lines WHERE batch_id = ? AND done = 0 "
                               "AND line > ? ORDER BY line LIMIT ?", (batch_id, after, limit)).fetchall()
        return [InputLine(row[0], row[1], row[2], bytes(row[3])) for row in rows]

    def finish_line(self, batch_id: str, line: int, ok: bool, result: bytes) -> bool:
        """Record a line's result once; False when it was already finished. StorageFull (nothing
        recorded) when the result would take the stored bytes past the budget."""
        db = self.db
        used = self.stored_bytes()
        if used + len(result) > self.max_storage_bytes:
            raise StorageFull(f"The batch's results would take the stored bytes past the budget of "
                              f"{self.max_storage_bytes} bytes ([batch] max_storage_mb; {used} used)")
        with _transaction(db):
            done = db.execute("UPDATE lines SET done = 1, ok = ?, result = ? WHERE batch_id = ? AND line = ? "
                              "AND done = 0", (int(ok), result, batch_id, line)).rowcount
            if done:
                column = "completed" if ok else "failed"
                db.execute(f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?", (batch_id,))
        if done:
            self._results += len(result)
        return bool(done)

    def fail_running(self, batch_id: str, errors: list[dict[str, Any]]) -> BatchRecord:
        """A running batch that cannot go on (its results reached the storage budget): failed with
        `errors`, its lines and results dropped, the database given back its space."""
        db = self.db
        with _transaction(db):
            dropped = self._drop_lines(batch_id)
            db.execute("UPDATE batches SET status = 'failed', failed_at = ?, errors = ? "
                       "WHERE id = ? AND status IN ('in_progress', 'finalizing', 'cancelling')",
                       (int(time.time()), orjson.dumps({"object": "list", "data": errors}).decode(), batch_id))
        self._results -= dropped
        self._compact()
        return self._batch(batch_id)

    def _drop_lines(self, batch_id: str) -> int:
        """Delete the batch's lines (inside a transaction); the bytes of results they held."""
        held = int(self.db.execute("SELECT COALESCE(SUM(LENGTH(result)), 0) FROM lines WHERE batch_id = ? "
                                   "AND done = 1", (batch_id,)).fetchone()[0])
        self.db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
        return held

    def _compact(self) -> None:
        """Give the space of deleted rows back to the disk: the WAL checkpointed and truncated, and
        the database rewritten when more than `COMPACT_BYTES` of it is free pages."""
        db = self.db
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        free = db.execute("PRAGMA freelist_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
        if free > COMPACT_BYTES:
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def mark_finalizing(self, batch_id: str) -> None:
        self.db.execute("UPDATE batches SET status = 'finalizing', finalizing_at = ? "
                        "WHERE id = ? AND status = 'in_progress'", (int(time.time()), batch_id))

    def finalize(self, batch_id: str) -> BatchRecord:
        """Write the output and error files in input order; finalizing -> completed, cancelling
        -> cancelled. The lines' rows go with the same transaction."""
        batch = self._batch(batch_id)
        final = {"finalizing": "completed", "cancelling": "cancelled"}.get(batch.status)
        if final is None:
            return batch
        written = {True: self._write_results(batch_id, True), False: self._write_results(batch_id, False)}
        db = self.db
        now = int(time.time())
        with _transaction(db):
            ids: dict[bool, str | None] = {}
            for ok, (path, size) in written.items():
                if path is None:
                    ids[ok] = None
                    continue
                record = FileRecord(f"file-{uuid.uuid4().hex[:24]}", f"{batch_id}_{'output' if ok else 'error'}.jsonl",
                                    "batch_output", size, now)
                os.replace(path, self.files_dir / record.id)
                db.execute("INSERT INTO files (id, filename, purpose, bytes, created_at, tenant) VALUES (?, ?, ?, ?, ?, ?)",
                           (record.id, record.filename, record.purpose, record.bytes, record.created_at,
                            batch.row.get("tenant") or ""))
                ids[ok] = record.id
            db.execute(f"UPDATE batches SET status = ?, {final}_at = ?, output_file_id = ?, error_file_id = ? "
                       "WHERE id = ?", (final, now, ids[True], ids[False], batch_id))
            dropped = self._drop_lines(batch_id)
        self._results -= dropped
        self._compact()
        return self._batch(batch_id)

    def _write_results(self, batch_id: str, ok: bool) -> tuple[Path | None, int]:
        path = self.tmp_dir / uuid.uuid4().hex
        size = 0
        with open(path, "wb") as out:
            for (result,) in self.db.execute("SELECT result FROM lines WHERE batch_id = ? AND done = 1 AND ok = ? "
                                             "ORDER BY line", (batch_id, int(ok))):
                out.write(result)
                size += len(result)
            out.flush()
            os.fsync(out.fileno())
        if size == 0:
            path.unlink()
            return None, 0
        return path, size


def _scoped(tenant: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE fragment (and its argument) keeping a query to one tenant's rows; None: all rows."""
    return ("", ()) if tenant is None else (" AND tenant = ?", (tenant,))


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")
