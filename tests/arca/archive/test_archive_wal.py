"""The WAL stays bounded: a checkpoint that cannot complete in the background is finished
with RESTART, and the committing thread checkpoints a WAL past WAL_HARD_BYTES itself."""

from __future__ import annotations

import os
from pathlib import Path

import arca.archive.store as store_module
from arca.archive import Archive, ArchiveConfig


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
        assert arc.info()["persistence"]["wal_restart_checkpoints"] >= 5
        assert arc.kv_get(b"block-0") is not None and arc.get(b"key-159") == b"v" * 1000
    with Archive(ArchiveConfig(directory=directory, kv_max_bytes=256 << 20)) as arc:
        assert arc.kv_get(b"block-159") is not None and arc.get(b"key-0") == b"v" * 1000
