"""llama.cpp's own server as the benches' peer: the binary (built once from the llama.cpp the node
runs), the kernel flag that makes it run the node's kernels, a running server, and the tokens
it computed.

    binary: --llama-server PATH, else $REAME_LLAMA_SERVER, else
            ~/.cache/reame-bench/llama-server/build-<the node's llama-cpp-python version>/bin/llama-server,
            else built there (nice 19, about 8 minutes on 2 cores) from --llama-source /
            $REAME_LLAMA_SOURCE (a llama.cpp tree), else from the tree deploy/llama_cpp/build.py
            makes: the pinned release's vendored llama.cpp with the node's patches, unpacked in
            the same directory. The node's version names its patches (`X+reame.<digest>`), so a
            build of other patches never stands in.

Same kernels: the node loads the model with or without llama.cpp's extra buffer types
(AMX, CPU repack) by `choose_kernels` (node/engine/kernels.py); the peer gets `--no-repack`
exactly when the node runs without them, and the benches print the flag.

A setting's options are checked against the build's own `--help` before it runs
(`unknown_flags`), so a renamed option is reported, not mistaken for the default.

Tokens computed by the peer come from the `timings` of each response: `prompt_n` prompt
tokens prefilled (its prompt cache answered `cache_n` more) and `predicted_n` generated.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.node_process import free_port, wait_healthy  # noqa: E402

CACHE = Path.home() / ".cache" / "reame-bench" / "llama-server"


def _version() -> str:
    import llama_cpp

    return str(llama_cpp.__version__)


def build_dir() -> Path:
    return CACHE / f"build-{_version()}"


def find_binary(explicit: str | None = None) -> Path | None:
    """The llama-server to run, when one is there (nothing is built)."""
    for candidate in (explicit, os.environ.get("REAME_LLAMA_SERVER"), str(build_dir() / "bin" / "llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _source(explicit: str | None) -> Path:
    given = explicit or os.environ.get("REAME_LLAMA_SOURCE")
    if given:
        return Path(given)
    from deploy.llama_cpp import build

    if build.local_version() != _version():
        print(f"the node runs llama-cpp-python {_version()}, the patched tree is {build.local_version()}: "
              "`make install` brings the node to it", flush=True)
    unpacked = CACHE / f"src-{build.local_version()}"
    if unpacked.is_dir():
        shutil.rmtree(unpacked)  # a tree from an interrupted unpack or patch is not trusted
    return build.source(unpacked) / "vendor" / "llama.cpp"


def ensure_binary(explicit: str | None = None, *, build: bool = True, source: str | None = None) -> Path | None:
    """The binary, built first when there is none and `build`; None (and why, printed) otherwise."""
    found = find_binary(explicit)
    if found is not None or not build:
        return found
    CACHE.mkdir(parents=True, exist_ok=True)
    out = build_dir()
    print(f"building llama-server {_version()} from the vendored llama.cpp into {out} (about 8 minutes, once) ...",
          flush=True)
    try:
        tree = _source(source)
        subprocess.run(["nice", "-n", "19", "cmake", "-S", str(tree), "-B", str(out), "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
        subprocess.run(["nice", "-n", "19", "cmake", "--build", str(out), "--target", "llama-server", "-j2"],
                       check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"llama-server could not be built ({exc})", flush=True)
        return None
    return find_binary()


def unknown_flags(binary: Path, args: list[str]) -> list[str]:
    """The options among `args` that this build's `llama-server --help` does not list."""
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    listed = subprocess.run([str(binary), "--help"], env=env, capture_output=True, text=True, timeout=60)
    words = set((listed.stdout + listed.stderr).replace(",", " ").split())
    return [arg for arg in args if arg.startswith("-") and arg not in words]


def kernel_flags(extra_buffers: bool) -> list[str]:
    """The peer's flags for the node's kernel verdict: no extra buffer types when the node has none."""
    return [] if extra_buffers else ["--no-repack"]


def kernel_line(extra_buffers: bool) -> str:
    flags = " ".join(kernel_flags(extra_buffers)) or "(no flag: repacking on, its default)"
    return f"# peer kernels: node extra buffers {'on' if extra_buffers else 'off'} -> llama-server {flags}"


@contextlib.contextmanager
def running(binary: Path, model: str | Path, args: list[str]) -> Iterator[str]:
    """The url of a llama-server on `model` with `args` (kernel flags included by the caller)."""
    port = free_port()
    CACHE.mkdir(parents=True, exist_ok=True)
    log_path = CACHE / f"server-{port}.log"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                                    "--no-webui", *args], env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process, log_path)  # it answers 503 while loading: urlopen raises
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def computed(timings: dict) -> tuple[int, int, int]:
    """(prompt tokens prefilled, prompt tokens its cache answered, tokens generated) of one response."""
    return int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0)), int(timings.get("predicted_n", 0))
