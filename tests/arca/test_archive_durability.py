"""Group commit, restart, SIGKILL of a writing child process, and damaged database files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

from arca.archive import Archive, ArchiveConfig, ArchiveCorruptError, ArchiveError


def test_writes_visible_at_once_durable_after_commit(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    arc = Archive(config)
    for i in range(100):
        arc.put(b"k%d" % i, b"v%d" % i)
    arc.delete(b"k5")
    assert arc.pending_writes == 100 and arc.get(b"k7") == b"v7"
    arc.commit()
    assert arc.pending_writes == 0
    assert arc.info()["persistence"]["commits"] == 1
    arc.close()
    with Archive(config) as again:
        assert again.dbsize() == 99 and again.get(b"k99") == b"v99" and again.get(b"k5") is None


def test_second_process_cannot_open_the_same_directory(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path)):
        code = f"from arca.archive import *; Archive(ArchiveConfig(directory={str(tmp_path)!r}))"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "in use by another process" in result.stderr


def test_log_over_its_bound_is_folded_in_the_background_keeping_last_write(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc._entries.log.fold_after = 10
        arc._entries.log.fold_slice = 7
        for round_ in range(5):
            for i in range(20):
                arc.put(b"k%d" % i, b"r%d" % round_)
            arc.delete(b"k%d" % round_)
            arc.commit()
        deadline = time.monotonic() + 10
        while arc.fold_backlog > 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert arc._entries.log.folds > 0 and arc.fold_backlog <= 10
        assert arc.info()["persistence"]["log_folding"] == "ok"
    with Archive(config) as arc:
        assert arc.dbsize() == 19 and arc.get(b"k4") is None
        assert all(arc.get(b"k%d" % i) == b"r4" for i in range(20) if i != 4)


WRITER = textwrap.dedent("""
    import sys
    from arca.archive import Archive, ArchiveConfig
    arc = Archive(ArchiveConfig(directory=sys.argv[1], durability=sys.argv[2]))
    i = 0
    while True:
        for _ in range(7):
            arc.put(b"key:%d" % i, b"value:%d" % i)
            i += 1
        arc.observe(b"ns", (i).to_bytes(4, "little") * 3)
        arc.commit()
        print(i, flush=True)           # acknowledged: everything below i is committed
""")


@pytest.mark.parametrize("durability", ["commit", "fsync"])
def test_sigkill_loses_no_committed_write(tmp_path, durability):
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), durability],
                             stdout=subprocess.PIPE, text=True)
    acknowledged = 0
    for line in child.stdout:
        acknowledged = int(line)
        if acknowledged >= 700:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with Archive(ArchiveConfig(directory=tmp_path)) as arc:
        missing = [i for i in range(acknowledged) if arc.get(b"key:%d" % i) != b"value:%d" % i]
        assert missing == []
        streams = arc.since(b"ns", 0, 10_000)
        assert len(streams) >= acknowledged // 7


def _filled(tmp_path, rows=300):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        for i in range(rows):
            arc.put(b"key:%05d" % i, b"MARKER-%05d-" % i + b"x" * 200)
    return config


def test_truncated_file_is_reported_not_served(tmp_path):
    config = _filled(tmp_path)
    path = config.database_path
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    with pytest.raises(ArchiveCorruptError) as caught:
        Archive(config)
    assert caught.value.path == path and str(path) in str(caught.value)
    assert "Recovery" in str(caught.value)


def test_garbled_header_is_reported(tmp_path):
    config = _filled(tmp_path)
    with open(config.database_path, "r+b") as handle:
        handle.write(b"this is not sqlite at all")
    with pytest.raises(ArchiveCorruptError):
        Archive(config)


def test_garbled_value_bytes_fail_their_checksum(tmp_path):
    config = _filled(tmp_path)
    data = bytearray(config.database_path.read_bytes())
    at = data.index(b"MARKER-00150-")
    data[at:at + 13] = b"GARBAGE-00150"
    config.database_path.write_bytes(bytes(data))
    with pytest.raises(ArchiveCorruptError) as caught:
        Archive(config)
    assert "checksum" in str(caught.value)


def test_newer_schema_is_refused(tmp_path):
    import sqlite3
    config = _filled(tmp_path, rows=1)
    with sqlite3.connect(config.database_path) as conn:
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(ArchiveError, match="newer"):
        Archive(config)


def test_compact_folds_the_log(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        for i in range(10):
            arc.put(b"k%d" % i, b"v")
        arc.delete(b"k3")
        assert arc.compact() == 10
        assert arc.compact() == 0
    with Archive(config) as arc:
        assert arc.dbsize() == 9 and not arc.exists(b"k3")


def test_fold_step_folds_in_slices_and_keeps_every_write(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc._entries.log.fold_slice = 30
        for round_ in range(4):
            for i in range(25):
                arc.put(b"k%d" % i, b"r%d" % round_, None if i % 2 else 10**13 + i)
            arc.commit()
        arc.delete(b"k0")
        arc.commit()
        assert arc.fold_backlog == 101
        steps = []
        while folded := arc.fold_step():
            steps.append(folded)
        assert steps == [50, 50, 1] and arc.fold_backlog == 0
    with Archive(config) as arc:
        assert arc.dbsize() == 24 and arc.get(b"k0") is None
        assert arc.get_entry(b"k2").expire_at_ms == 10**13 + 2 and arc.get_entry(b"k3").expire_at_ms is None
        assert all(arc.get(b"k%d" % i) == b"r3" for i in range(1, 25))


def test_version_1_row_log_is_migrated(tmp_path):
    import sqlite3
    config = ArchiveConfig(directory=tmp_path)
    Archive(config).close()
    with sqlite3.connect(config.database_path) as conn:  # turn the file back into schema 1
        conn.execute("DROP TABLE entries_batches")
        conn.execute("CREATE TABLE entries_log (seq INTEGER PRIMARY KEY, key BLOB NOT NULL, "
                     "value BLOB, expire_at INTEGER, crc INTEGER)")
        conn.executemany("INSERT INTO entries_log (key, value, expire_at, crc) VALUES (?, ?, ?, ?)",
                         [(b"a", b"1", None, zlib.crc32(b"1")), (b"b", b"2", None, zlib.crc32(b"2")),
                          (b"a", None, None, None), (b"c", b"3", 10**13, zlib.crc32(b"3"))])
        conn.execute("PRAGMA user_version=1")
    with Archive(config) as arc:
        assert sorted(arc.keys()) == [b"b", b"c"] and arc.get_entry(b"c").expire_at_ms == 10**13


def test_commits_go_on_while_the_log_is_folded_in_the_background(tmp_path):
    """Commits on this thread and folds on the folder's take turns on the write lock; after
    reopening, every key has its last value whatever slice each write went through."""
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc._entries.log.fold_after = 50
        arc._entries.log.fold_slice = 40
        expected: dict[bytes, bytes] = {}
        for round_ in range(60):
            for i in range(round_ % 7, 300, 7):
                arc.put(b"k%d" % i, b"r%d" % round_)
                expected[b"k%d" % i] = b"r%d" % round_
            arc.delete(b"k%d" % round_)
            expected.pop(b"k%d" % round_, None)
            arc.commit()
        assert arc._entries.log.folds > 0
    with Archive(config) as arc:
        assert {key: arc.get(key) for key in arc.keys()} == expected


def test_wal_is_checkpointed_off_the_committing_thread(tmp_path):
    config = ArchiveConfig(directory=tmp_path, max_bytes=256 * 1024 * 1024)
    with Archive(config) as arc:
        value = os.urandom(64 * 1024)
        for i in range(400):  # 25 MiB through the WAL, past the checkpoint threshold
            arc.put(b"k%d" % i, value)
            if i % 40 == 39:
                arc.commit()
        deadline = time.monotonic() + 10
        while arc.info()["persistence"]["wal_checkpoints"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert arc.info()["persistence"]["wal_checkpoints"] >= 1
    with Archive(config) as arc:
        assert arc.dbsize() == 400 and arc.get(b"k399") == value
