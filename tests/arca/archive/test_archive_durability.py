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


def test_log_rewrite_under_load_keeps_the_last_write_and_bounds_the_log(tmp_path):
    """Commits alone (no idle time) start and carry a rewrite once the log is over its
    threshold and twice the live keys; it ends by dropping every older batch."""
    config = ArchiveConfig(directory=tmp_path)
    expected: dict[bytes, bytes] = {}
    with Archive(config) as arc:
        arc._entries.log.rewrite_after = 100
        for round_ in range(40):
            for i in range(round_ % 7, 300, 7):  # about 43 records a commit over 300 keys
                arc.put(b"k%d" % i, b"r%d" % round_)
                expected[b"k%d" % i] = b"r%d" % round_
            arc.delete(b"k%d" % round_)
            expected.pop(b"k%d" % round_, None)
            arc.commit()
            assert arc.log_records <= 3 * 300 + 2 * 1024
        log = arc._entries.log
        assert log.rewrites >= 1 and arc.info()["persistence"]["log_rewrites"] == log.rewrites
    with Archive(config) as arc:
        assert {key: arc.get(key) for key in arc.keys()} == expected


WRITER = textwrap.dedent("""
    import sys
    from arca.archive import Archive, ArchiveConfig
    arc = Archive(ArchiveConfig(directory=sys.argv[1], durability=sys.argv[2]))
    # Log rewrites all the time, each spread over several commits: SIGKILL lands in one.
    arc._entries.log.rewrite_after = 50
    arc._entries.log.rewrite_slice = 16
    i = 0
    while True:
        for _ in range(7):
            arc.put(b"key:%d" % i, b"value:%d" % i)
            for j in range(3):  # overwrites: the log outgrows twice the live keys
                arc.put(b"hot:%d" % ((3 * i + j) % 13), b"%d" % i)
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
        assert all(int(arc.get(b"hot:%d" % k)) >= acknowledged - 8 for k in range(13))
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


def test_compact_rewrites_the_log_to_the_live_keys(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        for round_ in range(3):
            for i in range(10):
                arc.put(b"k%d" % i, b"v%d" % round_)
            arc.commit()
        arc.delete(b"k3")
        assert arc.compact() == 31  # 30 writes and the deletion
        assert arc.log_records == 9
        assert arc.compact() == 9 and arc.log_records == 9
    with Archive(config) as arc:
        assert arc.dbsize() == 9 and not arc.exists(b"k3") and arc.get(b"k9") == b"v2"


def test_idle_maintenance_rewrites_in_steps_while_writes_go_on(tmp_path):
    """Maintenance steps (idle time) and commits interleave: every key keeps its last write,
    TTLs included, and the finished rewrite leaves about one record per live key."""
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc._entries.log.rewrite_after_idle = 100
        for round_ in range(4):
            for i in range(6000):
                arc.put(b"k%d" % i, b"r%d" % round_, None if i % 2 else 10**13 + i)
            arc.commit()
        assert arc.maintenance_due()
        steps = 0
        while arc.maintenance_step():
            steps += 1
            arc.put(b"k%d" % steps, b"during")  # writes between the steps
            arc.delete(b"k%d" % (1000 + steps))
            arc.commit()
        # Each step and each commit after it re-logged 1024 keys: 6000 keys took three of each.
        assert steps == 3 and not arc.maintenance_due() and arc._entries.log.rewrites == 1
        assert arc.log_records <= 6000 + 4 * steps
        expected = {key: arc.get_entry(key) for key in arc.keys()}
    with Archive(config) as arc:
        assert {key: arc.get_entry(key) for key in arc.keys()} == expected
        assert arc.get(b"k1") == b"during" and arc.get(b"k1001") is None
        assert arc.get_entry(b"k10").expire_at_ms == 10**13 + 10 and arc.get_entry(b"k11").expire_at_ms is None


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
