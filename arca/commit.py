"""Group commit: replies held until the writes before them commit, and the retries of a failed commit.

Commands apply writes to the archive at once; a write becomes durable at the
archive's next `commit()`. While the archive holds uncommitted writes, a connection's
replies are held back; once per event-loop tick (after every read of that tick has been
processed) the server commits once and only then releases the held replies. So every
acknowledged write is committed, and N concurrent writers cost one transaction, not N. In
`everysec` durability replies leave at once and a timer commits once a second.

A commit that fails (a full disk) is logged once, and the server then refuses write
commands with -MISCONF, answers reads at once (they are no longer held) and retries the
commit every second; the connections whose replies waited for the failed commit keep
waiting for a retry that succeeds (then get their replies) or are closed after
STALLED_REPLY_SECONDS, never told that a write which did not commit succeeded. The first
successful retry is logged once and everything returns to normal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from arca.archive.errors import ArchiveError
from arca.state import ServerOptions, ServerState

log = logging.getLogger(__name__)

# While commits fail: how often one is retried, and how long replies that wait for the
# failed commit are held before their connection is closed instead.
COMMIT_RETRY_SECONDS = 1.0
STALLED_REPLY_SECONDS = 10.0


class Waiting(Protocol):
    """A connection as the group commit sees it (arca/connection.py's Connection is one)."""

    held: list[bytes] | None  # replies waiting for the next commit, None when none wait
    transport: asyncio.Transport | None  # None once the connection is lost

    def send(self, out: list[bytes]) -> None:
        """Write out now (and close if the connection is closing)."""

    def release(self) -> None:
        """The commit its held replies waited for is done: send them."""


class GroupCommit:
    """The commit schedule: replies held for the tick's commit, the everysec timer, the retries."""

    def __init__(self, archive: Any, options: ServerOptions, state: ServerState) -> None:
        self.archive = archive
        self.options = options
        self.state = state
        self.stopping = False
        # In commit and fsync modes replies wait for the commit of the writes before them.
        self.hold_replies = options.durability != "everysec"
        self.pending_queues = archive.pending_queues
        self._waiting: list[Waiting] = []
        # While commits fail: connections whose replies wait for a retry, and until when.
        self._stalled: list[tuple[Waiting, float]] = []
        self._retry_timer: asyncio.TimerHandle | None = None
        self._commit_scheduled = False
        self.loop: asyncio.AbstractEventLoop  # the running loop, from start() on
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if not self.hold_replies:
            self._timer = self.loop.call_later(1.0, self._every_second)

    def stop(self) -> None:
        """No more timers and retries (the server's close() commits one last time)."""
        self.stopping = True
        for timer in (self._timer, self._retry_timer):
            if timer is not None:
                timer.cancel()

    def deliver(self, conn: Waiting, out: list[bytes]) -> None:
        if conn.held is not None:
            conn.held += out
        elif self.hold_replies and any(self.pending_queues):
            conn.held = out
            self._waiting.append(conn)
            if not self._commit_scheduled:
                self._commit_scheduled = True
                self.loop.call_soon(self.commit_tick)
        else:
            conn.send(out)

    def commit(self) -> bool:
        if not self.archive.pending_writes:
            self._commits_work()
            return True
        started = time.perf_counter()
        try:
            self.archive.commit()
        except Exception as error:
            self._commits_fail(error)
            return False
        stats = self.state.stats
        stats.commits += 1
        stats.commit_seconds += time.perf_counter() - started
        self._commits_work()
        return True

    def _commits_fail(self, error: Exception) -> None:
        """Refuse writes, serve reads, retry: see the module docstring."""
        state = self.state
        if state.persistence_error is None:
            log.error("commit failed: %s. Write commands are refused (-MISCONF) and the commit is "
                      "retried every %g s; reads are served meanwhile", error, COMMIT_RETRY_SECONDS,
                      exc_info=not isinstance(error, ArchiveError))
            state.persistence_error = str(error)
            self.hold_replies = False  # nothing new to commit: reads are answered at once
        if self._retry_timer is None and not self.stopping:
            self._retry_timer = self.loop.call_later(COMMIT_RETRY_SECONDS, self._retry_commit)

    def _commits_work(self) -> None:
        state = self.state
        if state.persistence_error is not None:
            log.warning("commits succeed again: write commands are accepted")
            state.persistence_error = None
            self.hold_replies = self.options.durability != "everysec"
        if self._stalled:
            stalled, self._stalled = self._stalled, []
            for conn, _ in stalled:
                conn.release()

    def _retry_commit(self) -> None:
        self._retry_timer = None
        if self.commit() or self.stopping:
            return
        now = time.monotonic()
        keep = []
        for conn, deadline in self._stalled:
            if now < deadline:
                keep.append((conn, deadline))
            elif conn.transport is not None:
                conn.held = None
                conn.transport.abort()  # never acknowledge a write that did not commit
        self._stalled = keep

    def commit_tick(self) -> None:
        self._commit_scheduled = False
        committed = self.commit()
        waiting, self._waiting = self._waiting, []
        if committed:
            for conn in waiting:
                conn.release()
            return
        # Their replies may acknowledge writes of the failed commit: they wait for a retry.
        deadline = time.monotonic() + STALLED_REPLY_SECONDS
        self._stalled += [(conn, deadline) for conn in waiting if conn.transport is not None]

    def _every_second(self) -> None:
        self.commit()
        if not self.stopping:
            self._timer = self.loop.call_later(1.0, self._every_second)
