"""The L1 table's C code under AddressSanitizer and UndefinedBehaviorSanitizer.

The extension is compiled again with `-fsanitize=address,undefined` into a copy of the
`arca` package, and the table's own tests plus the live plain-path tests run against that
build in a child process (the sanitizer runtimes preloaded, any finding fatal). A
use-after-free, an overflow or a signed-integer overflow in parsing fails this test even
where the ordinary build happens to survive it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _runtime(name: str) -> str | None:
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.mark.slow
def test_table_and_plain_path_are_clean_under_sanitizers(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (it also builds the ordinary extension)")
    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    if asan is None or ubsan is None:
        pytest.skip("gcc's sanitizer runtimes (libasan, libubsan) are not installed")
    shutil.copytree(ROOT / "arca", tmp_path / "arca", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "shared", tmp_path / "shared", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    module = tmp_path / "arca" / "archive" / ("_l1table" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                    "-fsanitize=address,undefined", f"-I{include}", "arca/archive/_l1table.c", "-o", str(module)],
                   cwd=tmp_path, check=True, timeout=300)
    env = dict(os.environ, LD_PRELOAD=f"{asan}:{ubsan}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
               PYTHONPATH=str(tmp_path))
    code = ("import arca.archive._l1table as m, sys; "
            f"sys.exit(0 if m.__file__ == {str(module)!r} else 'the sanitized build was not the one imported')")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=60)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=.",
         "tests/arca/archive/test_l1table.py", "tests/arca/test_connection_plain_path.py",
         "tests/arca/archive/test_archive_entries.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert " passed" in done.stdout
