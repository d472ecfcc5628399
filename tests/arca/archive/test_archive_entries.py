"""L1 entries through the Archive API: values, TTLs, the LRU byte budget, OOM, SCAN."""

from __future__ import annotations

import time

import pytest

from arca.archive import Archive, ArchiveConfig, ArchiveOOMError, Entry
from arca.archive.config import ENTRY_OVERHEAD


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def arc(tmp_path):
    archive = Archive(ArchiveConfig(directory=tmp_path))
    yield archive
    archive.close()


def test_put_get_delete_exists(arc):
    assert arc.get(b"k") is None
    arc.put(b"k", b"v1")
    arc.put(b"k", b"v2")
    assert arc.get(b"k") == b"v2"
    assert arc.exists(b"k") and arc.dbsize() == 1
    assert arc.get_entry(b"k") == Entry(b"v2", None)
    assert arc.delete(b"k") is True
    assert arc.delete(b"k") is False
    assert arc.get(b"k") is None and not arc.exists(b"k")


def test_binary_keys_and_empty_values(arc):
    key = bytes(range(256))
    arc.put(key, b"")
    assert arc.get(key) == b""
    assert list(arc.keys()) == [key]


def test_ttl_lazy_expiry_and_persist(arc):
    arc.put(b"short", b"x", expire_at_ms=now_ms() + 50)
    arc.put(b"long", b"y", expire_at_ms=now_ms() + 60_000)
    assert arc.get_entry(b"long").expire_at_ms > now_ms()
    time.sleep(0.08)
    assert arc.get(b"short") is None
    assert arc.exists(b"long")
    assert arc.set_expire(b"long", None) is True
    assert arc.get_entry(b"long") == Entry(b"y", None)
    assert arc.set_expire(b"missing", now_ms() + 1000) is False


def test_active_expiry_removes_untouched_keys(arc):
    for i in range(50):
        arc.put(b"t%d" % i, b"x", expire_at_ms=now_ms() + 30)
    arc.put(b"keep", b"x")
    time.sleep(0.06)
    assert arc.expire_cycle() == 50
    assert arc.dbsize() == 1
    assert arc.info()["memory"]["expired_keys"] == 50


def test_expire_in_the_past_deletes(arc):
    arc.put(b"k", b"v")
    assert arc.set_expire(b"k", now_ms() - 1) is True
    assert not arc.exists(b"k")
    arc.put(b"gone", b"v", expire_at_ms=now_ms() - 1)
    assert arc.get(b"gone") is None


def test_plain_put_clears_ttl(arc):
    arc.put(b"k", b"v", expire_at_ms=now_ms() + 60_000)
    arc.put(b"k", b"w")
    assert arc.get_entry(b"k").expire_at_ms is None


def test_lru_budget_evicts_least_recently_used_and_reads_count(tmp_path):
    entry = len(b"k0") + 100 + ENTRY_OVERHEAD
    with Archive(ArchiveConfig(directory=tmp_path, max_bytes=3 * entry)) as arc:
        for i in range(3):
            arc.put(b"k%d" % i, b"x" * 100)
        assert arc.get(b"k0") is not None          # k0 becomes the most recently used
        arc.put(b"k3", b"x" * 100)                  # evicts k1, the least recently used
        assert sorted(arc.keys()) == [b"k0", b"k2", b"k3"]
        assert arc.info()["memory"]["evicted_keys"] == 1
        assert arc.info()["memory"]["l1_used_bytes"] <= 3 * entry


def test_eviction_survives_restart(tmp_path):
    entry = len(b"k0") + 100 + ENTRY_OVERHEAD
    config = ArchiveConfig(directory=tmp_path, max_bytes=2 * entry)
    with Archive(config) as arc:
        for i in range(4):
            arc.put(b"k%d" % i, b"x" * 100)
    with Archive(config) as arc:
        assert sorted(arc.keys()) == [b"k2", b"k3"]


def test_value_larger_than_budget_is_oom(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path, max_bytes=1000)) as arc:
        arc.put(b"small", b"x")
        with pytest.raises(ArchiveOOMError):
            arc.put(b"big", b"x" * 1000)
        assert arc.get(b"small") == b"x"        # a refused write evicts nothing


def test_scan_is_complete_under_changes(arc):
    for i in range(1000):
        arc.put(b"k%04d" % i, b"v")
    seen, cursor, first = set(), 0, True
    while first or cursor:
        first = False
        cursor, keys = arc.scan(cursor, 37)
        seen.update(keys)
        # Meanwhile: reads reorder the LRU, new keys arrive, some keys are deleted.
        arc.get(b"k0999")
        arc.put(b"new%d" % len(seen), b"v")
        arc.delete(b"k0%03d" % (len(seen) % 100))
    survivors = {b"k%04d" % i for i in range(100, 1000)}
    assert survivors <= seen


def test_flush_clears_and_persists(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc.put(b"a", b"1")
        arc.commit()
        arc.flush()
        arc.put(b"b", b"2")
        assert arc.dbsize() == 1
    with Archive(config) as arc:
        assert list(arc.keys()) == [b"b"]


def test_info_sections(arc):
    arc.put(b"k", b"v", expire_at_ms=now_ms() + 10_000)
    info = arc.info()
    assert {"memory", "persistence", "keyspace", "arca"} <= set(info)
    assert info["keyspace"]["db0"].startswith("keys=1,expires=1")
    assert info["persistence"]["pending_writes"] == 1


def test_put_many_sets_all_or_nothing_and_drops_ttls(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path, max_bytes=1000)) as arc:
        arc.put(b"a", b"old", now_ms() + 60_000)
        with pytest.raises(ArchiveOOMError):
            arc.put_many([(b"a", b"1"), (b"big", b"x" * 2000)])
        assert arc.get(b"a") == b"old" and not arc.exists(b"big")
        arc.put_many([(b"a", b"1"), (b"b", b"2"), (b"a", b"3")])
        assert arc.get_entry(b"a") == Entry(b"3", None) and arc.get(b"b") == b"2"
        assert arc.get_with_deadline(b"b") == (b"2", None) and arc.dbsize() == 2


def _resp(argvs: list[list[bytes]]) -> bytes:
    return b"".join(b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)
                    for argv in argvs)


def test_run_plain_matches_one_call_per_command(tmp_path):
    """The pipelined GET/SET path: replies, LRU order, evictions, cleared TTLs, hit counts and
    the stop before an entry over the budget are exactly those of one call per command."""
    argvs = [[b"SET", b"k%d" % (i % 7), b"v" * (10 + 13 * i % 90)] if i % 3 else [b"get", b"k%d" % (i % 9)]
             for i in range(40)]
    argvs.insert(30, [b"SET", b"big", b"x" * 2000])
    one, each = (Archive(ArchiveConfig(directory=tmp_path / name, max_bytes=1000)) for name in ("one", "each"))
    with one, each:
        for arc in (one, each):
            arc.put(b"k3", b"old", now_ms() + 60_000)
        expected = []
        for argv in argvs[:30]:
            if argv[0] == b"SET":
                one.put(argv[1], argv[2])
                expected.append(b"+OK\r\n")
            else:
                value = one.get(argv[1])
                expected.append(b"$-1\r\n" if value is None else b"$%d\r\n%b\r\n" % (len(value), value))
        data = _resp(argvs)
        reply, consumed, count, last = each.run_plain(data, 2, 1 << 20, 1 << 20)
        assert (reply, count, last) == (b"".join(expected), 30, b"set")
        assert data[consumed:].startswith(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n")  # left for the -OOM reply
        rest = _resp(argvs[31:])
        assert each.run_plain(rest, 3, 1 << 20, 1 << 20)[1:3] == (len(rest), len(argvs) - 31)
        for argv in argvs[31:]:
            one.put(argv[1], argv[2]) if argv[0] == b"SET" else one.get(argv[1])
        assert list(each.keys()) == list(one.keys())
        volatile = ("used_memory_rss", "used_memory_peak")
        memory = [{k: v for k, v in arc.info()["memory"].items() if k not in volatile} for arc in (one, each)]
        assert memory[0] == memory[1] and memory[0]["evicted_keys"] > 0
        assert one.info()["arca"]["keyspace_hits"] == each.info()["arca"]["keyspace_hits"] > 0
        assert each.get_entry(b"k3") == one.get_entry(b"k3") and one.get_entry(b"k3").expire_at_ms is None


def test_the_log_is_rewritten_by_bytes_when_large_values_are_rewritten_often(tmp_path):
    """A few keys with large values written over and over: the record count stays far under
    its threshold, the bytes bound starts rewrites, and the log stays near the live bytes."""
    from arca.archive.archive import Archive
    from arca.archive.config import ArchiveConfig

    archive = Archive(ArchiveConfig(tmp_path))
    archive._entries.log.rewrite_after_bytes = 1 << 20  # 1 MiB, so the test stays small
    value = b"v" * 16_384
    for round_ in range(400):  # 400 commits x 10 keys x 16 KiB = 64 MiB written
        for key in range(10):
            archive.put(f"k{key}".encode(), value + round_.to_bytes(2, "little"))
        archive.commit()
    log = archive._entries.log
    assert log.rewrites > 0
    assert log.bytes < 4 * (1 << 20)
    archive.close()
    reopened = Archive(ArchiveConfig(tmp_path))
    assert reopened.get(b"k3") == value + (399).to_bytes(2, "little")
    reopened.close()
