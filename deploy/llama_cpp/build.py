"""The llama.cpp a node runs: llama-cpp-python's pinned release with this directory's patches.

    python deploy/llama_cpp/build.py install [--python PY] [--wheels DIR]  # build once, install
    python deploy/llama_cpp/build.py wheel                                 # build once, print the path
    python deploy/llama_cpp/build.py source DIR                            # the patched llama.cpp tree

`make install` runs `install` before the project's own install, so the pin in pyproject.toml
(`llama-cpp-python==X`) is already met by the patched build and pip leaves it in place. The
wheel carries a local version, `X+reame.<digest of the patches>`, so every benchmark header
and `pip list` show which build runs.

The release's source distribution comes from the package index (pip's own HTTP cache keeps
it); its vendored llama.cpp gets `patches/*.patch` in name order (`patch -p1`, each made
against that tree's root). The wheel is built once for each release, set of patches,
CMAKE_ARGS, Python, machine and CPU features, and kept beside pip's cache
(`~/.cache/pip/reame-wheels/`, or `$REAME_WHEEL_CACHE`): about 6 minutes on 2 cores the first
time, a second afterwards. CMAKE_ARGS passes through to llama.cpp's CMake as it does for a
plain `pip install llama-cpp-python` (the Dockerfile's CPU variants, for one).

bench/llama_server.py builds the peer, llama.cpp's own server, from the same patched tree,
so both sides of a comparison run the same kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PACKAGE = "llama-cpp-python"


def release() -> str:
    """The version pyproject.toml pins."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"llama-cpp-python==([^"]+)"', text)
    if found is None:
        raise SystemExit("pyproject.toml pins no llama-cpp-python release")
    return found.group(1)


def patches() -> list[Path]:
    return sorted((HERE / "patches").glob("*.patch"))


def digest() -> str:
    """What the patched build is made of: the release and every patch's bytes."""
    h = hashlib.sha256(release().encode())
    for patch in patches():
        h.update(patch.name.encode() + b"\0" + patch.read_bytes())
    return h.hexdigest()[:10]


def local_version() -> str:
    return f"{release()}+reame.{digest()}"


def cache_dir() -> Path:
    """$REAME_WHEEL_CACHE, else beside pip's own cache ($PIP_CACHE_DIR or ~/.cache/pip), so
    whatever keeps pip's cache between runs keeps this wheel too."""
    base = os.environ.get("REAME_WHEEL_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip") / "reame-wheels"


def _sdist(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"{PACKAGE}=={release()}", "-d", str(into)], check=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip download gave no source distribution of {PACKAGE} {release()}")
    return found[0]


def source(into: Path) -> Path:
    """The release's source unpacked under `into`, its llama.cpp patched; the package root."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(_sdist(into)) as archive:
        archive.extractall(into, filter="data")
    root = into / f"llama_cpp_python-{release()}"
    tree = root / "vendor" / "llama.cpp"
    for patch in patches():
        with patch.open("rb") as stream:
            subprocess.run(["patch", "-p1", "--forward", "--batch", "--quiet", "-d", str(tree)], stdin=stream,
                           check=True)
    init = root / "llama_cpp" / "__init__.py"
    text = init.read_text()
    stamped = re.sub(r'__version__ = "[^"]+"', f'__version__ = "{local_version()}"', text, count=1)
    if stamped == text:
        raise SystemExit(f"no __version__ line in {init}")
    init.write_text(stamped)
    return root


def cpu_flags() -> str:
    """The CPU's feature list (Linux: /proc/cpuinfo's flags or Features line; else empty). A
    build with llama.cpp's defaults (GGML_NATIVE) uses every instruction of the CPU it was
    built on, so a wheel kept in a home shared by other CPUs must not be taken there."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def shelf() -> Path:
    """Where this build's wheel is kept: one directory per release, patches, CMAKE_ARGS,
    Python, machine and CPU features."""
    made_for = (f"{sys.implementation.cache_tag}\0{platform.machine()}\0{os.environ.get('CMAKE_ARGS', '')}"
                f"\0{cpu_flags()}")
    return cache_dir() / hashlib.sha256(f"{local_version()}\0{made_for}".encode()).hexdigest()[:12]


def wheel() -> Path:
    """The patched wheel: from the cache, else built into it."""
    kept = shelf()
    built = sorted(kept.glob("*.whl"))
    if built:
        return built[0]
    print(f"building {PACKAGE} {local_version()} (llama.cpp with {len(patches())} patch(es); about 6 minutes "
          f"on 2 cores, once) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="reame-llama-") as work:
        root = source(Path(work) / "src")
        out = Path(work) / "out"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(root)],
                       check=True)
        made = sorted(out.glob("*.whl"))
        if not made:
            raise SystemExit("pip wheel made no wheel")
        kept.mkdir(parents=True, exist_ok=True)
        partial = kept / (made[0].name + ".partial")
        shutil.copy2(made[0], partial)
        partial.rename(kept / made[0].name)  # whole or not at all: an interrupted build leaves no wheel
    return kept / made[0].name


def install(python: str, wheels: Path | None = None) -> None:
    """Into `python`'s environment: a wheel of this very build from `wheels`, else `wheel()`."""
    given = sorted(wheels.glob(f"llama_cpp_python-{local_version()}-*.whl")) if wheels else []
    path = given[0] if given else wheel()
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(path)], check=True)
    print(f"{PACKAGE} {local_version()} installed from {path}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub_install = sub.add_parser("install", help="build the wheel once and install it")
    sub_install.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets it")
    sub_install.add_argument("--wheels", type=Path, help="a directory that may hold this build's wheel already")
    sub.add_parser("wheel", help="build the wheel once and print its path")
    sub_source = sub.add_parser("source", help="unpack and patch the source into DIR; print llama.cpp's tree")
    sub_source.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.command == "install":
        install(args.python, args.wheels)
    elif args.command == "wheel":
        print(wheel())
    else:
        print(source(args.dir) / "vendor" / "llama.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
