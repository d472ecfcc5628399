"""A real `reame arca` process under concurrent writes and OBSERVEs is killed with SIGKILL and
restarted: every acknowledged SET and every acknowledged ARCA.OBSERVE is there afterwards.

Also: a damaged database is refused at start with the file named and a recovery hint.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from arca.launch import free_port, spawn_arca

ROOT = Path(__file__).resolve().parents[2]


def start_arca(directory: Path, port: int, *extra: str) -> subprocess.Popen:
    """A `reame arca` child whose stdout and stderr the test reads (its log lines)."""
    return spawn_arca(directory, *extra, port=port, capture=True)[0]


def tokens_for(writer: int, i: int) -> list[int]:
    return [writer * 1_000_000 + i * 10 + j for j in range(8)]


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["commit", "fsync"])
def test_sigkill_loses_no_acknowledged_write(tmp_path, durability):
    port = free_port()
    proc = start_arca(tmp_path / "arca", port, "--durability", durability)
    acked: dict[bytes, bytes] = {}
    observed: dict[int, bytes] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def set_writer(writer: int) -> None:
        client = redis.Redis(port=port, protocol=2, socket_timeout=5)
        i = 0
        while not stop.is_set():
            key, value = b"w%d:%d" % (writer, i), b"value-%d-%d" % (writer, i)
            try:
                client.set(key, value)
            except (redis.ConnectionError, redis.TimeoutError):
                return
            with lock:
                acked[key] = value
            i += 1

    def observer() -> None:
        client = redis.Redis(port=port, protocol=2, socket_timeout=5)
        i = 0
        while not stop.is_set():
            packed = struct.pack("<8I", *tokens_for(9, i))
            try:
                stream_id = client.execute_command("ARCA.OBSERVE", packed)
            except (redis.ConnectionError, redis.TimeoutError):
                return
            with lock:
                observed[int(stream_id)] = packed
            i += 1

    threads = [threading.Thread(target=set_writer, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=observer))
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(acked) > 100 and len(observed) > 10

    proc = start_arca(tmp_path / "arca", port)
    try:
        client = redis.Redis(port=port, protocol=2)
        keys = list(acked)
        values = []
        for start in range(0, len(keys), 1000):
            values += client.mget(keys[start : start + 1000])
        missing = [k for k, v in zip(keys, values) if v != acked[k]]
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:3]}"
        streams: dict[int, bytes] = {}
        cursor = 0
        while True:
            batch = client.execute_command("ARCA.SINCE", cursor, "COUNT", 1000)
            if not batch:
                break
            for stream_id, packed in batch:
                streams[int(stream_id)] = packed
            cursor = int(batch[-1][0])
        lost = [sid for sid, packed in observed.items() if streams.get(sid) != packed]
        assert not lost, f"{len(lost)} acknowledged observations lost"
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()
    assert b"every acknowledged write is committed" in out


def test_graceful_sigterm_and_bound_address_logged(tmp_path):
    proc = start_arca(tmp_path / "arca", free_port())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert b"listening on 127.0.0.1:" in out


def test_port_zero_logs_the_port_really_bound(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "arca", "--port", "0", "--dir", str(tmp_path / "arca")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    line = b""
    deadline = time.monotonic() + 30
    while b"listening on" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    try:
        port = int(line.split(b"listening on 127.0.0.1:")[1].split()[0])
        assert port > 0
        assert redis.Redis(port=port).ping() is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_damaged_database_is_refused_with_the_file_named(tmp_path):
    directory = tmp_path / "arca"
    port = free_port()
    proc = start_arca(directory, port)
    redis.Redis(port=port).set("k", "v")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    database = directory / "archive.db"
    with open(database, "r+b") as handle:
        handle.seek(0)
        handle.write(b"this is not an sqlite file" * 100)
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "arca", "--port", str(port), "--dir", str(directory)],
        cwd=ROOT, capture_output=True, timeout=60,
    )
    text = (done.stdout + done.stderr).decode()
    assert done.returncode == 3, text
    assert str(database) in text and "recovery" in text.lower()


def test_protected_mode_refuses_a_public_bind_without_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REAME_ARCA_PASSWORD"}
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "arca", "--host", "0.0.0.0", "--port", str(free_port()),
         "--dir", str(tmp_path / "arca")],
        cwd=ROOT, capture_output=True, timeout=60, env=env,
    )
    assert done.returncode == 2
    assert b"protected mode" in done.stdout + done.stderr


def test_shutdown_command_commits_and_exits(tmp_path):
    port = free_port()
    proc = start_arca(tmp_path / "arca", port)
    client = redis.Redis(port=port, protocol=3)
    client.set("kept", "yes")
    client.shutdown()  # redis-py expects the connection to close without a reply
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()
    proc = start_arca(tmp_path / "arca", port)
    try:
        assert redis.Redis(port=port).get("kept") == b"yes"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
