"""The node's archive clients: embedded archive, and a remote RESP server behind the breaker.

The remote tests run against a real `redis-server` on a free loopback port: GET/SET and the
breaker behave the same against any RESP server, and a process is easy to kill and restart.
The ARCA-specific commands (OBSERVE/DRAFT against the real daemon) are covered end to end
in tests/e2e/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time

import pytest

from arca.archive import ArchiveConfig
from node.archive.breaker import Breaker
from node.archive.client import EmbeddedArchive, RemoteArchive
from node.archive.redis_mapping import cursor_of
from shared.tokens import pack_tokens
from tests.conftest import free_port

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")


async def test_embedded_round_trip(tmp_path):
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=1 << 20))
    try:
        assert archive.state() == "embedded"
        assert await archive.get(b"k") is None
        await archive.set(b"k", b"v" * 100)
        assert await archive.get(b"k") == b"v" * 100
        await archive.observe(b"ns", [10, 11, 12, 13, 14])
        assert [packed for _, packed in await archive.since(b"ns", 0, 10)] == [pack_tokens([10, 11, 12, 13, 14])]
        assert await archive.since(b"other", 0, 10) == []
    finally:
        await archive.close()
    reopened = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=1 << 20))
    try:
        assert await reopened.get(b"k") == b"v" * 100  # committed after the write
    finally:
        await reopened.close()


async def test_embedded_archive_keeps_its_l1_log_short(tmp_path):
    """A node writes one L1 record per commit and has no idle-time hook: after the commits,
    the embedded archive takes the log-rewrite steps itself, so the log stays near the live
    keys instead of growing with every write."""
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=64 << 20))
    try:
        inner = archive._archive
        inner._entries.log.rewrite_after_idle = 200
        for i in range(3000):
            await archive.set(b"answer:%d" % (i % 50), b"v%d" % i)
        assert inner.info()["persistence"]["log_rewrites"] >= 1
        assert inner.log_records <= 200 + 2 * 1024
    finally:
        await archive.close()
    reopened = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=64 << 20))
    try:
        assert [await reopened.get(b"answer:%d" % k) for k in range(50)] == [b"v%d" % (2950 + k) for k in range(50)]
    finally:
        await reopened.close()


async def test_embedded_failure_is_a_counted_miss(tmp_path):
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=1024))
    try:
        await archive.set(b"big", b"x" * 4096)  # larger than the whole budget: the archive refuses
        assert archive.counters.errors["set"] == 1
        assert await archive.get(b"big") is None
    finally:
        await archive.close()


class RedisProcess:
    def __init__(self, port: int, directory) -> None:
        self.port = port
        self.directory = directory
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == b"PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def archive_cursor(port: int) -> int:
    """The cursor of the one entry of the `ns` stream, read with redis-cli."""
    out = subprocess.run(["redis-cli", "-p", str(port), "xrange", "reame:l4:{ns}", "-", "+"],
                         capture_output=True).stdout.split()
    return cursor_of(out[0])


@pytest.fixture
def redis_server(tmp_path):
    server = RedisProcess(free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


@needs_redis
async def test_remote_round_trip(redis_server):
    archive = RemoteArchive("127.0.0.1", redis_server.port, timeout_ms=500)
    await archive.start()
    try:
        assert archive.state() == "ok"
        await archive.set(b"k", b"\x00\xffbinary")
        assert await archive.get(b"k") == b"\x00\xffbinary"
        await archive.set(b"t", b"v", ttl_s=100)
        ttl = subprocess.run(["redis-cli", "-p", str(redis_server.port), "ttl", "reame:l1:t"],
                             capture_output=True).stdout
        assert 0 < int(ttl) <= 100
        assert await archive.get(b"missing") is None
        assert archive.kind == "redis"  # learnt at connect: the tiers go to plain Redis types
        await archive.observe(b"ns", [1, 2, 3])
        assert await archive.since(b"ns", 0, 10) == [(archive_cursor(redis_server.port), pack_tokens([1, 2, 3]))]
        assert archive.counters.errors["observe"] == 0
        assert archive.state() == "ok"
    finally:
        await archive.close()


@needs_redis
async def test_breaker_opens_once_and_closes_when_back(redis_server, caplog):
    caplog.set_level(logging.INFO, logger="node.archive.breaker")
    archive = RemoteArchive("127.0.0.1", redis_server.port, timeout_ms=300)
    await archive.start()
    try:
        await archive.set(b"k", b"v")
        redis_server.stop()
        for _ in range(20):
            assert await archive.get(b"k") is None
        assert archive.state() == "degraded"
        assert archive.counters.errors["get"] >= 1
        went_away = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(went_away) == 1
        redis_server.start()
        deadline = time.monotonic() + 15
        while archive.state() != "ok" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert archive.state() == "ok"
        await archive.set(b"k", b"again")
        assert await archive.get(b"k") == b"again"
        back = [r for r in caplog.records if "is back after" in r.getMessage()]
        assert len(back) == 1
    finally:
        await archive.close()


async def test_remote_unreachable_from_the_start():
    archive = RemoteArchive("127.0.0.1", free_port(), timeout_ms=200)
    await archive.start()
    try:
        assert archive.state() == "degraded"
        assert await archive.get(b"k") is None
        await archive.set(b"k", b"v")
        assert await archive.kv_exists([b"a", b"b"]) == [False, False]
    finally:
        await archive.close()


async def test_breaker_backs_off_between_failed_probes(caplog):
    caplog.set_level(logging.INFO, logger="node.archive.breaker")
    breaker = Breaker("test", initial_backoff_s=0.01, max_backoff_s=0.04)
    outcomes = iter([False, False, False, True])
    seen_backoffs = []

    async def probe() -> bool:
        seen_backoffs.append(breaker.backoff_s)
        if next(outcomes):
            breaker.succeeded()
            return True
        breaker.failed(ConnectionError("still down"))
        return False

    breaker.start_watching(probe)
    breaker.failed(ConnectionError("down"))
    breaker.failed(ConnectionError("a call already in flight"))  # counts once
    assert breaker.state == "open"
    deadline = time.monotonic() + 5
    while not breaker.closed and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await breaker.stop_watching()
    assert breaker.closed
    assert seen_backoffs == [0.01, 0.02, 0.04, 0.04]
    messages = [record.getMessage() for record in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1 and sum("is back after" in m for m in messages) == 1
