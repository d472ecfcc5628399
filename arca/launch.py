"""Starting a `reame arca` process from Python and waiting until it answers.

For fleets scripted in Python, the benchmarks and the end-to-end tests: a free port, the
daemon as a child process, and a wait until the port answers an inline PING with +PONG
(which redis-server answers too, so a Redis baseline can use the same wait).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

DAEMON = "import sys; from arca.daemon import main; sys.exit(main(sys.argv[1:]))"


class LaunchError(RuntimeError):
    """The server exited before answering, or did not answer in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_pong(port: int, proc: subprocess.Popen, *, host: str = "127.0.0.1",
                  timeout: float = 30.0) -> None:
    """Return once `host:port` answers PING; LaunchError (with the output, when the process's
    stdout is a pipe) if the process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise LaunchError(f"server for port {port} exited with {proc.returncode}\n{output}")
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise LaunchError(f"server on port {port} did not answer PING within {timeout:.0f} s")


def stop(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """Terminate a started server and wait for it; kill it if it does not exit in time."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spawn_arca(directory: Path, *args: str, port: int | None = None, host: str = "127.0.0.1",
               capture: bool = False, timeout: float = 30.0) -> tuple[subprocess.Popen, int]:
    """Start the daemon on `directory` (a free port unless given) and wait until it answers.

    `args` are further daemon flags (`--durability`, `--max-mb`, ...). With `capture`, the
    daemon's stdout and stderr go to one pipe the caller reads (keep its output small);
    otherwise they are discarded.
    """
    port = free_port(host) if port is None else port
    command: Sequence[str] = [sys.executable, "-c", DAEMON, "--host", host, "--port", str(port),
                              "--dir", str(directory), *args]
    output = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    wait_for_pong(port, proc, host=host, timeout=timeout)
    return proc, port
