"""`reame arca` on an empty archive.db: refused with exit 3, the file named and a hint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from arca.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_an_empty_archive_db_exits_3_naming_the_file(tmp_path):
    directory = tmp_path / "arca"
    directory.mkdir()
    database = directory / "archive.db"
    database.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "arca", "--port", str(free_port()), "--dir", str(directory)],
        cwd=ROOT, capture_output=True, timeout=60,
    )
    text = (done.stdout + done.stderr).decode()
    assert done.returncode == 3, text
    assert str(database) in text and "empty (0 bytes)" in text and "recovery" in text.lower()
