"""Resource bounds of a real `reame arca` process: RSS after abandoned large bulks, the WAL
under sustained mixed writes, and a full disk."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from arca.launch import spawn_arca


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def test_rss_stays_flat_over_rounds_of_abandoned_large_bulks(tmp_path: Path):
    """Five clients per round declare a 60 MiB value, send 16 MiB of it and close."""
    proc, port = spawn_arca(tmp_path / "arca")
    try:
        chunk = b"x" * (1 << 20)
        header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (60 << 20)
        samples = []
        for _ in range(6):
            sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
            for sock in sockets:
                sock.sendall(header)
                for _ in range(16):
                    sock.sendall(chunk)
            time.sleep(0.2)
            for sock in sockets:
                sock.close()
            time.sleep(0.3)
            samples.append(rss_mib(proc.pid))
        # Each round buffers 80 MiB while its clients are connected; none of it may survive
        # them (before the fix every round added its 80 MiB: 6 rounds, +480 MiB).
        assert samples[-1] - samples[0] < 40, samples
        assert max(samples) < samples[0] + 90, samples
    finally:
        stop(proc)
