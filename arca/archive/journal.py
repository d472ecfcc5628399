"""Group commit: every part's pending writes become durable in one SQLite transaction.

Writes are applied to the in-memory state at once (visible to reads) and recorded as
pending by the part that owns them. `GroupCommit.commit()` opens one transaction, lets each
part write its pending rows (one executemany per table), commits, and only then tells the
parts to forget them: a failed transaction keeps everything pending for the next attempt.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Protocol, Sequence

from .errors import ArchiveError
from .store import Store

log = logging.getLogger(__name__)


class Journaled(Protocol):
    @property
    def pending_writes(self) -> int: ...

    @property
    def pending_queues(self) -> tuple:
        """The containers holding this part's pending writes (cleared in place, never
        replaced): writes are pending while any of them is non-empty."""
        ...

    def write_pending(self, conn: sqlite3.Connection) -> None: ...

    def committed(self) -> None: ...

    def rolled_back(self) -> None:
        """The transaction that wrote this part's pending writes did not commit."""
        ...


class GroupCommit:
    def __init__(self, store: Store, parts: Sequence[Journaled]) -> None:
        self._store = store
        self._parts = tuple(parts)
        self.pending_queues = tuple(queue for part in self._parts for queue in part.pending_queues)
        self.commits = 0
        self.failures = 0
        self.last_commit_us = 0
        self.last_commit_unix = 0

    @property
    def pending_writes(self) -> int:
        return sum(part.pending_writes for part in self._parts)

    def commit(self) -> None:
        """Write every pending change in one transaction; raises ArchiveError on failure."""
        parts = [part for part in self._parts if part.pending_writes]
        if not parts:
            return
        started = time.perf_counter()
        try:
            self._store.bound_wal()
        except ArchiveError:  # nothing was written: every part's writes stay pending
            self.failures += 1
            raise
        try:
            with self._store.transaction() as conn:
                for part in parts:
                    part.write_pending(conn)
        except sqlite3.Error as error:
            for part in parts:
                part.rolled_back()
            self.failures += 1
            raise ArchiveError(f"commit to {self._store.path} failed: {error}") from error
        for part in parts:
            part.committed()
        self.commits += 1
        self.last_commit_us = int((time.perf_counter() - started) * 1e6)
        self.last_commit_unix = int(time.time())
