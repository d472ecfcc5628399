"""L3 KV blocks through the Archive API: write-once, own LRU budget, checksums, restart."""

from __future__ import annotations

import sqlite3

import pytest

from arca.archive import Archive, ArchiveConfig, ArchiveOOMError


def test_put_get_exists_and_never_rewritten(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path)) as arc:
        assert arc.kv_put(b"h1", b"state-1") is True
        assert arc.kv_get(b"h1") == b"state-1"            # served before the commit
        arc.commit()
        assert arc.kv_put(b"h1", b"state-2") is False
        assert arc.kv_get(b"h1") == b"state-1"
        assert arc.kv_exists([b"h1", b"h2"]) == [True, False]
    with Archive(ArchiveConfig(directory=tmp_path)) as arc:
        assert arc.kv_get(b"h1") == b"state-1"


def test_own_lru_budget_never_evicts_l1(tmp_path):
    config = ArchiveConfig(directory=tmp_path, kv_max_bytes=300, max_bytes=10_000)
    with Archive(config) as arc:
        arc.put(b"answer", b"kept")
        for i in range(3):
            arc.kv_put(b"b%d" % i, bytes([i]) * 100)
        arc.commit()
        assert arc.kv_get(b"b0") is not None                # b0 becomes most recently used
        arc.kv_put(b"b3", b"x" * 100)                       # evicts b1
        assert arc.kv_exists([b"b0", b"b1", b"b2", b"b3"]) == [True, False, True, True]
        assert arc.get(b"answer") == b"kept"
        with pytest.raises(ArchiveOOMError):
            arc.kv_put(b"huge", b"x" * 301)
        assert arc.info()["arca"]["kv_used_bytes"] <= 300
    with Archive(config) as arc:
        assert arc.kv_exists([b"b0", b"b1", b"b2", b"b3"]) == [True, False, True, True]


def test_damaged_blob_is_a_miss_and_dropped(tmp_path):
    config = ArchiveConfig(directory=tmp_path)
    with Archive(config) as arc:
        arc.kv_put(b"h", b"good bytes")
    with sqlite3.connect(config.database_path) as conn:
        conn.execute("UPDATE kv_blocks SET blob = ? WHERE key = ?", (b"evil bytes", b"h"))
    with Archive(config) as arc:
        assert arc.kv_get(b"h") is None
        assert arc.kv_exists([b"h"]) == [False]
        assert arc.info()["arca"]["kv_damaged"] == 1
