"""The WAL stays bounded: a checkpoint that cannot complete in the background is finished
with RESTART, and the committing thread checkpoints a WAL past WAL_HARD_BYTES itself."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import arca.archive.store as store_module
from arca.archive import Archive, ArchiveConfig
from arca.archive.errors import ArchiveError


def wal_size(directory: Path) -> int:
    try:
        return (directory / "archive.db-wal").stat().st_size
    except FileNotFoundError:
        return 0


def test_commits_checkpoint_a_wal_past_the_hard_bound(tmp_path, monkeypatch):
    # No background checkpoints at all: only the bound on the committing thread acts.
    monkeypatch.setattr(store_module, "CHECKPOINT_WAL_BYTES", 1 << 40)
    monkeypatch.setattr(store_module, "WAL_HARD_BYTES", 4 << 20)
    monkeypatch.setattr(store_module, "WAL_SIZE_LIMIT", 1 << 20)
    directory = tmp_path / "arca"
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        peak = 0
        for i in range(160):  # 40 MiB of KV blocks, ten times the bound
            arc.kv_put(b"block-%d" % i, os.urandom(256 << 10))
            arc.put(b"key-%d" % i, b"v" * 1000)
            arc.commit()
            peak = max(peak, wal_size(directory))
        assert peak <= (4 << 20) + (512 << 10), peak  # the bound plus one commit
        assert int(arc.info()["persistence"]["wal_restart_checkpoints"]) >= 5
        assert arc.kv_get(b"block-0") is not None and arc.get(b"key-159") == b"v" * 1000
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        assert arc.kv_get(b"block-159") is not None and arc.get(b"key-0") == b"v" * 1000


def _fast_checkpoints(monkeypatch, *, restart: int, hard: int = 1 << 40) -> None:
    """Small thresholds and a 10 ms checkpointer, so a few MiB of writes exercise them."""
    monkeypatch.setattr(store_module, "CHECKPOINT_WAL_BYTES", 1 << 20)
    monkeypatch.setattr(store_module, "CHECKPOINT_INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr(store_module, "RESTART_WAL_BYTES", restart)
    monkeypatch.setattr(store_module, "WAL_HARD_BYTES", hard)
    monkeypatch.setattr(store_module, "WAL_SIZE_LIMIT", 1 << 20)


def test_the_checkpointer_thread_restarts_the_wal_under_sustained_commits(tmp_path, monkeypatch):
    """Commits that never pause: each passive checkpoint copies every frame it saw, but the
    commits made while it copied keep the log from ever being wholly copied, so only a RESTART
    starts it over. Before the fix the thread restarted only after a passive checkpoint that
    copied less than it saw (never, with no reader), and the WAL grew with every byte written
    (here to ~40 MiB) until the committing thread's backstop (off here) caught it."""
    _fast_checkpoints(monkeypatch, restart=4 << 20)
    directory = tmp_path / "arca"
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        peak = 0
        for i in range(640):  # 40 MiB
            arc.kv_put(b"block-%d" % i, os.urandom(64 << 10))
            arc.commit()
            time.sleep(0.001)
            peak = max(peak, wal_size(directory))
        assert peak <= (4 << 20) + (6 << 20), peak / (1 << 20)
        assert int(arc.info()["persistence"]["wal_restart_checkpoints"]) >= 3
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        assert all(arc.kv_get(b"block-%d" % i) is not None for i in range(0, 640, 7))


def test_a_wal_that_cannot_be_checkpointed_refuses_commits_rather_than_pass_its_bound(tmp_path, monkeypatch):
    """A reader holding an old snapshot (another process reading the file) pins the WAL: no
    checkpoint can start it over. The commit that finds it past the bound waits
    RESTART_WAIT_SECONDS, then fails (the server refuses writes, -MISCONF, and retries);
    its writes stay pending and commit once the reader lets go. Before the fix the commit
    waited the full busy timeout and then appended anyway, past the bound."""
    _fast_checkpoints(monkeypatch, restart=1 << 40, hard=4 << 20)
    monkeypatch.setattr(store_module, "CHECKPOINT_WAL_BYTES", 1 << 40)  # the backstop alone
    monkeypatch.setattr(store_module, "RESTART_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_SECONDS", 2.0)
    directory = tmp_path / "arca"
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        arc.kv_put(b"first", b"x" * 1000)
        arc.commit()
        reader = sqlite3.connect(directory / "archive.db", isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM kv_blocks").fetchone()[0] == 1
        refused = None
        started = time.monotonic()
        for i in range(64):  # 16 MiB, four times the bound
            arc.kv_put(b"block-%d" % i, os.urandom(256 << 10))
            try:
                arc.commit()
            except ArchiveError as error:
                refused = error
                break
        waited = time.monotonic() - started
        assert refused is not None and "WAL" in str(refused), refused
        assert wal_size(directory) <= (4 << 20) + (512 << 10)
        assert waited < 0.3 + 1.5, waited  # one wait of RESTART_WAIT_SECONDS, not the busy timeout
        assert arc.info()["persistence"]["commit_failures"] == 1
        assert arc.pending_writes >= 1  # the refused commit's writes are kept
        reader.execute("ROLLBACK")
        reader.close()
        arc.commit()  # the reader gone, the checkpoint completes and the commit goes through
        assert arc.pending_writes == 0
        last = i
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        assert all(arc.kv_get(b"block-%d" % j) is not None for j in range(last + 1))


def _no_checkpoints(monkeypatch) -> None:
    """Neither the thread nor the backstop checkpoints: the WAL only grows, so its growth
    over a commit is every frame that commit wrote."""
    monkeypatch.setattr(store_module, "CHECKPOINT_WAL_BYTES", 1 << 40)
    monkeypatch.setattr(store_module, "WAL_HARD_BYTES", 1 << 40)


def test_the_commit_that_ends_a_log_rewrite_writes_no_copy_of_the_old_log(tmp_path, monkeypatch):
    """The commit that ends an L1 log rewrite deletes every older batch. SQLite built with
    secure_delete on (Debian's) overwrote each freed page with zeros, one WAL frame per page:
    under the mixed load of tests/e2e/test_arca_resources.py that one commit wrote 64.8 MiB
    (any other commit at most 2.7 MiB), and where it landed late in the log the WAL peaked at
    142.6 MiB, past WAL_HARD_BYTES (128 MiB) plus one ordinary commit. Here a 16 MiB log is
    dropped: before the fix that commit wrote 17.2 MiB, now about its own 2 MiB."""
    _no_checkpoints(monkeypatch)
    directory = tmp_path / "arca"
    value = os.urandom(16 << 10)
    with Archive(ArchiveConfig(directory=directory)) as arc:
        log = arc._entries.log
        log.rewrite_after_bytes = 16 << 20
        growth: list[tuple[int, int, int]] = []  # (WAL bytes the commit wrote, log bytes before, after)
        for round_ in range(40):
            for i in range(64):  # 1 MiB a commit over the same 64 keys
                arc.put(b"key-%d" % i, b"%d:" % round_ + value)
            before, log_before = wal_size(directory), log.bytes
            arc.commit()
            growth.append((wal_size(directory) - before, log_before, log.bytes))
            if log.rewrites:
                break
        assert log.rewrites == 1, growth
        written, log_before, log_after = growth[-1]
        assert log_before >= 15 << 20 and log_after <= 2 << 20, growth  # the old log was dropped...
        assert written <= 3 << 20, (written / (1 << 20), growth)  # ...without writing it again
        assert max(grown for grown, _, _ in growth[:-1]) <= 3 << 20, growth
    with Archive(ArchiveConfig(directory=directory)) as arc:
        assert all(arc.get(b"key-%d" % i) == b"%d:" % round_ + value for i in range(64))


def test_a_log_rewrite_of_large_values_goes_in_slices_of_bounded_bytes(tmp_path, monkeypatch):
    """A commit carries a running rewrite at least 1024 keys further: of 64 KiB values that
    was every one of the 256 live keys, 16 MiB in one commit that wrote 256 KiB of its own
    (and 64 MiB a commit with the default 256 MiB L1 full of such values). The slice now
    also stops at REWRITE_SLICE_BYTES or twice the commit's own bytes, whichever is more."""
    _no_checkpoints(monkeypatch)
    directory = tmp_path / "arca"
    value = os.urandom(64 << 10)
    with Archive(ArchiveConfig(directory=directory)) as arc:
        log = arc._entries.log
        for i in range(256):  # 16 MiB live
            arc.put(b"key-%d" % i, value)
        arc.commit()
        written = []
        for round_ in range(400):
            for i in range(4 * round_, 4 * round_ + 4):  # 256 KiB a commit
                arc.put(b"key-%d" % (i % 256), b"%d:" % round_ + value)
            before = wal_size(directory)
            arc.commit()
            written.append(wal_size(directory) - before)
            if log.rewrites:
                break
        assert log.rewrites == 1, written
        assert max(written) <= (2 << 20), (max(written) / (1 << 20), written)
    with Archive(ArchiveConfig(directory=directory)) as arc:
        assert arc.dbsize() == 256 and arc.get(b"key-%d" % ((4 * round_) % 256)) == b"%d:" % round_ + value
