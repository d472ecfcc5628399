"""An empty or missing archive.db is damage, reported before SQLite can take it for a new
database (and throw away the pages a WAL still holds); a new archive is never empty on disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from arca.archive import Archive, ArchiveConfig, ArchiveCorruptError


def crash_after_writes(directory) -> None:
    """A process that commits 200 keys and dies without closing: its pages stay in the WAL."""
    code = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from arca.archive import Archive, ArchiveConfig
        arc = Archive(ArchiveConfig(directory=Path({str(directory)!r})))
        for i in range(200):
            arc.put(b"k%d" % i, b"v" * 200)
        arc.commit()
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_new_archive_is_never_an_empty_file(tmp_path):
    directory = tmp_path / "arca"
    with Archive(ArchiveConfig(directory=directory)) as arc:
        assert (directory / "archive.db").stat().st_size > 0
        assert not (directory / "archive.db.new").exists()
        arc.put(b"k", b"v")
    with Archive(ArchiveConfig(directory=directory)) as arc:
        assert arc.get(b"k") == b"v"


def test_an_empty_database_file_is_refused(tmp_path):
    directory = tmp_path / "arca"
    directory.mkdir()
    (directory / "archive.db").write_bytes(b"")
    with pytest.raises(ArchiveCorruptError) as caught:
        Archive(ArchiveConfig(directory=directory))
    assert caught.value.path == directory / "archive.db"
    assert "empty (0 bytes)" in caught.value.detail and "delete archive.db" in caught.value.hint
    assert (directory / "archive.db").stat().st_size == 0  # left as it was


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_database_file_lost_under_its_wal_is_refused_and_the_wal_kept(tmp_path, damage):
    directory = tmp_path / "arca"
    crash_after_writes(directory)
    database, wal = directory / "archive.db", directory / "archive.db-wal"
    wal_bytes = wal.stat().st_size
    assert wal_bytes > 0
    if damage == "truncated":
        database.write_bytes(b"")
    else:
        database.unlink()
    with pytest.raises(ArchiveCorruptError) as caught:
        Archive(ArchiveConfig(directory=directory))
    assert "archive.db-wal holds" in caught.value.detail and "restore archive.db" in caught.value.hint
    assert wal.stat().st_size == wal_bytes  # nothing was thrown away


def test_pages_in_the_wal_of_a_crashed_process_are_read_back(tmp_path):
    directory = tmp_path / "arca"
    crash_after_writes(directory)
    with Archive(ArchiveConfig(directory=directory)) as arc:
        assert arc.get(b"k199") == b"v" * 200
