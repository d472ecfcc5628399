"""deploy/llama_cpp/build.py: the patched tree, its version stamp and the wheel it reuses.

The download itself is pip's (`pip download` of the pinned release); here `_sdist` hands over a
small source distribution made in the test, and the patches directory is the test's own, so
what is tested is the project's part: unpacking, applying every patch in name order with the
real `patch`, stamping the local version, refusing a patch that does not apply, and taking an
already built wheel (from the cache or a wheels directory) without building again.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from deploy.llama_cpp import build

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")

RELEASE = build.release()
ROOT = f"llama_cpp_python-{RELEASE}"


def make_sdist(where: Path) -> Path:
    files = {
        f"{ROOT}/llama_cpp/__init__.py": f'from .llama_cpp import *\n\n__version__ = "{RELEASE}"\n',
        f"{ROOT}/vendor/llama.cpp/kernel.c": "int tile(void) {\n    return 4;\n}\n",
    }
    path = where / f"{ROOT}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


PATCH_1 = """first: return the width
--- a/kernel.c
+++ b/kernel.c
@@ -1,3 +1,3 @@
 int tile(void) {
-    return 4;
+    return 8;
 }
"""
PATCH_2 = """second: builds on the first
--- a/kernel.c
+++ b/kernel.c
@@ -1,3 +1,4 @@
 int tile(void) {
+    /* patched twice */
     return 8;
 }
"""


def _no_build(*args, **kwargs):
    raise AssertionError(f"built again: {args}")


@pytest.fixture
def patched_here(tmp_path, monkeypatch):
    """The build module with the test's sdist and patches directory."""
    here = tmp_path / "deploy"
    (here / "patches").mkdir(parents=True)
    (here / "patches" / "0002-second.patch").write_text(PATCH_2)
    (here / "patches" / "0001-first.patch").write_text(PATCH_1)
    sdist = make_sdist(tmp_path)
    monkeypatch.setattr(build, "HERE", here)
    monkeypatch.setattr(build, "_sdist", lambda into: sdist)
    monkeypatch.setenv("REAME_WHEEL_CACHE", str(tmp_path / "wheels"))
    return here


def test_the_source_is_patched_in_name_order_and_stamped(patched_here, tmp_path):
    root = build.source(tmp_path / "src")
    assert (root / "vendor" / "llama.cpp" / "kernel.c").read_text() == (
        "int tile(void) {\n    /* patched twice */\n    return 8;\n}\n")
    version = build.local_version()
    assert version.startswith(f"{RELEASE}+reame.") and len(version.split("+reame.")[1]) == 10
    assert f'__version__ = "{version}"' in (root / "llama_cpp" / "__init__.py").read_text()


def test_a_changed_patch_is_another_build(patched_here):
    before = build.local_version()
    (patched_here / "patches" / "0002-second.patch").write_text(PATCH_2.replace("patched twice", "patched again"))
    assert build.local_version() != before


def test_a_patch_that_does_not_apply_stops_the_build(patched_here, tmp_path):
    (patched_here / "patches" / "0003-stale.patch").write_text(PATCH_1)  # already applied: reversed hunk
    with pytest.raises(subprocess.CalledProcessError):
        build.source(tmp_path / "src")


def test_a_built_wheel_is_taken_again_without_building(patched_here, tmp_path, monkeypatch):
    name = f"llama_cpp_python-{build.local_version()}-py3-none-linux_x86_64.whl"
    wheels = tmp_path / "given"
    wheels.mkdir()
    (wheels / name).write_bytes(b"wheel")
    installed: list[list[str]] = []
    monkeypatch.setattr(build.subprocess, "run", lambda cmd, **kw: installed.append(cmd))
    monkeypatch.setattr(build, "source", _no_build)
    build.install("python-of-the-env", wheels)  # a wheel of this very build in a wheels directory
    assert installed[-1][-1] == str(wheels / name) and installed[-1][0] == "python-of-the-env"

    (wheels / name).rename(wheels / name.replace("+reame.", "+reame.0"))  # another build's wheel: not taken
    monkeypatch.setattr(build, "wheel", lambda: tmp_path / "from-the-cache.whl")
    build.install("python-of-the-env", wheels)
    assert installed[-1][-1] == str(tmp_path / "from-the-cache.whl")


def test_the_cache_gives_back_its_wheel_and_another_cmake_args_is_another_shelf(patched_here, monkeypatch):
    kept = build.shelf()
    kept.mkdir(parents=True)
    (kept / "llama_cpp_python-x-py3-none-any.whl").write_bytes(b"wheel")
    monkeypatch.setattr(build, "source", _no_build)
    assert build.wheel() == kept / "llama_cpp_python-x-py3-none-any.whl"
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    assert build.shelf() != kept


def test_a_wheel_built_for_other_cpu_features_is_not_taken(patched_here, monkeypatch):
    here = build.shelf()
    monkeypatch.setattr(build, "cpu_flags", lambda: "fpu sse2")
    assert build.shelf() != here
