"""A node process for the API benchmarks: `reame run MODEL --serve` on a free port.

The node gets a fresh REAME_HOME (empty embedded archive, no prefix cache, no speculation:
the benchmarks measure the API and L1 alone) and is stopped with SIGTERM at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent

from offline_model import default_model  # noqa: E402,F401  (re-exported for l1_hit and load)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = 180) -> None:
    """Until GET url/health answers 200; the process's log tail if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def node_server(model: str, *extra: str, ctx: int = 2048, parallel: int = 4,
                env: dict[str, str] | None = None, home: Path | None = None,
                module: str = "node.cli") -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """(url, process, home) of a node serving `model`; `env` overrides the benchmark defaults
    (no prefix cache); `home` keeps REAME_HOME where the caller wants it; `module` is what
    `python -m` runs (the `reame` command, or a bench's launcher of it)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="reame-bench-") as scratch:
        home = Path(scratch) if home is None else home
        full_env = {**os.environ, "REAME_HOME": str(home), "REAME_CACHE_ENABLED": "false",
                    **(env or {})}
        log_path = home / "node.log"
        log = open(log_path, "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", module, "run", model, "--serve", "--port", str(port), "--ctx", str(ctx),
             "--parallel", str(parallel), *extra], cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process, log_path)
            yield url, process, home
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


@contextlib.contextmanager
def node_process(model: str, *extra: str, ctx: int = 2048, parallel: int = 4) -> Iterator[str]:
    with node_server(model, *extra, ctx=ctx, parallel=parallel) as (url, _process, _home):
        yield url


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]
