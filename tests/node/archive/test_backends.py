"""The remote archive against real servers: a plain redis-server (plain and TLS) and a real
Redis Cluster, through the node's one client.

A plain Redis gets every tier through plain types (redis_mapping.py): L1 strings with a TTL,
L3 parts under one hash tag (one cluster slot per state), one L4 stream per model read from a
cursor, sessions. Wrong certificates and wrong passwords are refused and said so in the log.
In the cluster, a killed master costs only its slots until its replica takes over.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.address import AddressError, ArchiveAddress, parse_address
from node.archive.errors import ArchiveUnavailable
from node.archive.remote import RedisLimits, RemoteArchive
from node.archive.servers import TlsFiles
from shared.tokens import pack_tokens
from tests.certs import make_certs
from tests.redis_servers import RedisCluster, RedisServer, needs_redis


@pytest.mark.parametrize("text, address", [
    ("10.0.0.5:6420", ArchiveAddress((("10.0.0.5", 6420),))),
    ("[::1]:7000", ArchiveAddress((("::1", 7000),))),
    ("arca://box:6420", ArchiveAddress((("box", 6420),))),
    ("arca://box", ArchiveAddress((("box", 6420),))),
    ("redis://box", ArchiveAddress((("box", 6379),))),
    ("rediss://box:6380", ArchiveAddress((("box", 6380),), tls=True)),
    ("redis://default:s%40cret@box:1/0", ArchiveAddress((("box", 1),), username="default", password="s@cret")),
    ("rediss://:pw@box:2", ArchiveAddress((("box", 2),), tls=True, password="pw")),
    ("redis+cluster://a:1,b:2,c", ArchiveAddress((("a", 1), ("b", 2), ("c", 6379)), cluster=True)),
    ("rediss+cluster://u:p@a:1,b:2", ArchiveAddress((("a", 1), ("b", 2)), True, True, "u", "p")),
])
def test_remote_forms(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["box", "box:0", "box:99999", "http://box:1", "redis://a:1,b:2",
                                  "redis://pw@box:1", "redis://", "redis+cluster://"])
def test_bad_remote_forms(text):
    with pytest.raises(AddressError):
        parse_address(text)


def test_display_hides_credentials():
    assert parse_address("rediss+cluster://u:secret@a:1,b:2").display() == "rediss+cluster://a:1,b:2"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def redis_plain(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-plain")).start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def redis_tls(tmp_path_factory, certs):
    server = RedisServer(tmp_path_factory.mktemp("redis-tls"), tls=certs, password="hunter2").start()
    yield server
    server.kill()


async def tiers_round_trip(archive: RemoteArchive) -> None:
    """Every tier through one client; the caller checks where it landed."""
    await archive.set(b"answer", b"\x00\xff42")
    assert await archive.get(b"answer") == b"\x00\xff42"
    assert await archive.get(b"nothing") is None
    for part, blob in ((1, b"second"), (0, b"first")):  # the fleet tier pushes the last part first
        await archive.kv_put(b"abcd" + (b".%d" % part if part else b""), blob)
    assert await archive.kv_exists([b"abcd", b"abcd.1", b"ffff"]) == [True, True, False]
    assert await archive.kv_get(b"abcd.1") == b"second"
    await archive.observe(b"fp", [1, 2, 3, 4])
    await archive.observe(b"fp", [5, 6, 7, 8])
    streams = await archive.since(b"fp", 0, 10)
    assert [packed for _, packed in streams] == [pack_tokens([1, 2, 3, 4]), pack_tokens([5, 6, 7, 8])]
    assert await archive.since(b"fp", streams[0][0], 10) == streams[1:]
    assert await archive.since(b"fp", streams[1][0], 10) == []
    assert await archive.since(b"other", 0, 10) == []
    await archive.session_put("sess_" + "a" * 24, b'{"id": 1}', 60)
    assert await archive.session_get("sess_" + "a" * 24) == b'{"id": 1}'
    await archive.session_delete("sess_" + "a" * 24)
    assert await archive.session_get("sess_" + "a" * 24) is None


@needs_redis
async def test_plain_redis_gets_every_tier(redis_plain):
    archive = RemoteArchive(address=parse_address(f"redis://127.0.0.1:{redis_plain.port}"), timeout_ms=3000,
                            limits=RedisLimits(l1_ttl_s=100, kv_ttl_s=50, corpus_max_streams=10))
    await archive.start()
    try:
        assert archive.kind == "redis" and archive.state() == "ok"
        await tiers_round_trip(archive)
        assert 0 < int(redis_plain.call("ttl", "reame:l1:answer")) <= 100
        assert 0 < int(redis_plain.call("ttl", "reame:l3:{abcd}.1")) <= 50
        assert redis_plain.call("type", "reame:l4:{fp}") == "stream"
        for i in range(300):  # MAXLEN ~ keeps the stream near its bound
            await archive.observe(b"fp", [i, 1, 2])
        assert int(redis_plain.call("xlen", "reame:l4:{fp}")) < 300
        assert sum(archive.counters.errors.values()) == 0
    finally:
        await archive.close()


@needs_redis
async def test_redis_over_tls_with_a_password(redis_tls, certs, caplog):
    caplog.set_level(logging.ERROR, logger="node.archive")
    good = TlsFiles(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    archive = RemoteArchive(address=parse_address(f"rediss://:hunter2@127.0.0.1:{redis_tls.port}"), tls=good,
                            timeout_ms=3000)
    await archive.start()
    try:
        assert archive.kind == "redis" and archive.state() == "ok"
        await tiers_round_trip(archive)
    finally:
        await archive.close()

    wrong_ca = RemoteArchive(address=parse_address(f"rediss://:hunter2@127.0.0.1:{redis_tls.port}"),
                             tls=TlsFiles(str(certs.other_ca)), timeout_ms=3000)
    wrong_password = RemoteArchive(address=parse_address(f"rediss://:nope@127.0.0.1:{redis_tls.port}"), tls=good,
                                   timeout_ms=3000)
    for refused in (wrong_ca, wrong_password):
        await refused.start()
        try:
            assert refused.state() == "degraded"
            assert await refused.get(b"answer") is None  # a miss, never an exception
            with pytest.raises(ArchiveUnavailable):
                await refused.session_get("sess_" + "b" * 24)
        finally:
            await refused.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("TLS handshake failed" in m and "certificate verify failed" in m for m in errors), errors
    assert any("credentials refused" in m and "[arca] password" in m for m in errors), errors


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = RedisCluster(tmp_path_factory.mktemp("cluster"))
    try:
        nodes.start()
    except BaseException:
        nodes.stop()
        raise
    yield nodes
    nodes.stop()


def keys_on_first_master(cluster: RedisCluster, count: int) -> list[bytes]:
    """L1 keys whose slot the first master serves (slots 0-5460 after `--cluster create`)."""
    found: list[bytes] = []
    i = 0
    while len(found) < count:
        key = b"answer-%d" % i
        if int(cluster.masters[1].call("cluster", "keyslot", "reame:l1:" + key.decode())) <= 5460:
            found.append(key)
        i += 1
    return found


def keys_elsewhere(cluster: RedisCluster, count: int) -> list[bytes]:
    found: list[bytes] = []
    i = 0
    while len(found) < count:
        key = b"other-%d" % i
        if int(cluster.masters[1].call("cluster", "keyslot", "reame:l1:" + key.decode())) > 5460:
            found.append(key)
        i += 1
    return found


@needs_redis
@pytest.mark.slow  # a Redis Cluster of real servers: the full suite's, not the fast tier's
async def test_cluster_follows_a_moved_slot(cluster):
    """A slot resharded after the client loaded the map: the MOVED reply is followed."""
    import itertools
    import subprocess

    from redis.crc import key_slot

    source, target = cluster.masters[1], cluster.masters[2]
    key = next(b"moved-%d" % i for i in itertools.count() if key_slot(b"reame:l1:moved-%d" % i) == 5461)
    archive = RemoteArchive(address=parse_address(cluster.url()), timeout_ms=3000)
    await archive.start()
    try:
        await archive.set(key, b"before")
        moved = subprocess.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{source.port}",
                                "--cluster-from", source.call("cluster", "myid"),
                                "--cluster-to", target.call("cluster", "myid"),
                                "--cluster-slots", "1", "--cluster-yes"], capture_output=True, text=True, timeout=60)
        assert moved.returncode == 0, moved.stdout[-2000:]
        cluster.wait(lambda: target.call("cluster", "countkeysinslot", "5461") == "1", 30, "slot 5461 to move")
        assert await archive.get(key) == b"before"  # MOVED: the client follows it to the new master
        await archive.set(key, b"after")
        assert target.call("get", "reame:l1:" + key.decode()) == "after"
        assert archive.state() == "ok" and archive.counters.errors["get"] == archive.counters.errors["set"] == 0
    finally:
        await archive.close()


@needs_redis
@pytest.mark.slow  # a Redis Cluster of real servers: the full suite's, not the fast tier's
async def test_cluster_follows_ask_during_a_migration(cluster):
    """A slot half-way through a migration: a key not on the old master yet is answered with
    ASK, and the client asks the importing master (ASKING first)."""
    import itertools

    from redis.crc import key_slot

    source, target = cluster.masters[1], cluster.masters[2]
    slot = "5470"
    key = next(b"ask-%d" % i for i in itertools.count() if key_slot(b"reame:l1:ask-%d" % i) == int(slot))
    source_id, target_id = source.call("cluster", "myid"), target.call("cluster", "myid")
    archive = RemoteArchive(address=parse_address(cluster.url()), timeout_ms=3000)
    await archive.start()
    try:
        assert target.call("cluster", "setslot", slot, "importing", source_id) == "OK"
        assert source.call("cluster", "setslot", slot, "migrating", target_id) == "OK"
        await archive.set(key, b"asked")  # the old master says ASK: the write lands on the new one
        assert target.call("cluster", "countkeysinslot", slot) == "1"
        assert source.call("cluster", "countkeysinslot", slot) == "0"
        assert await archive.get(key) == b"asked"
        assert archive.counters.errors["get"] == archive.counters.errors["set"] == 0
    finally:
        for node in cluster.masters:
            node.call("cluster", "setslot", slot, "node", target_id)
        await archive.close()


@needs_redis
@pytest.mark.slow  # a Redis Cluster of real servers: the full suite's, not the fast tier's
async def test_cluster_tiers_and_a_failed_master(cluster, caplog):
    caplog.set_level(logging.INFO, logger="node.archive")
    archive = RemoteArchive(address=parse_address(cluster.url()), timeout_ms=3000)
    await archive.start()
    try:
        assert archive.kind == "redis" and archive.state() == "ok"
        await tiers_round_trip(archive)
        # one hash tag per state: all of its parts on one slot
        slots = {cluster.masters[0].call("cluster", "keyslot", f"reame:l3:{{abcd}}{suffix}") for suffix in ("", ".1", ".2")}
        assert len(slots) == 1
        doomed, safe = keys_on_first_master(cluster, 5), keys_elsewhere(cluster, 5)
        for key in doomed + safe:
            await archive.set(key, b"v-" + key)

        cluster.masters[0].kill()  # mid-run: its slots go dark until the replica takes over
        for key in safe:
            assert await archive.get(key) == b"v-" + key  # the other masters keep their speed-up
        assert [await archive.get(key) for key in doomed] == [None] * 5  # misses, not errors
        for key in safe:
            assert await archive.get(key) == b"v-" + key  # one master's breaker does not close the rest
        assert archive.state() == "degraded"

        cluster.wait_failover()
        deadline = asyncio.get_running_loop().time() + 30
        while archive.state() != "ok" and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert archive.state() == "ok"  # the failover was followed
        await archive.set(doomed[0], b"after")
        assert await archive.get(doomed[0]) == b"after"
        assert await archive.get(safe[0]) == b"v-" + safe[0]
        assert cluster.replica.call("get", "reame:l1:" + doomed[0].decode()) == "after"
        messages = [r.getMessage() for r in caplog.records]
        assert any("unreachable" in m for m in messages) and any("replica serves its slots" in m for m in messages)
    finally:
        await archive.close()


@needs_redis
async def test_l3_on_a_server_of_its_own(redis_plain, tmp_path):
    from node.archive.client import open_archive
    from node.config import load_settings

    kv_server = RedisServer(tmp_path / "kv").start()
    settings = load_settings(None, {"arca.remote": f"redis://127.0.0.1:{redis_plain.port}",
                                    "arca.kv_remote": f"redis://127.0.0.1:{kv_server.port}", "arca.timeout_ms": 3000},
                             env={"REAME_HOME": str(tmp_path / "home")})
    archive = open_archive(settings)
    await archive.start()
    try:
        assert archive.kind == "redis" and archive.state() == "ok"
        await archive.set(b"split", b"answer")
        await archive.kv_put(b"beef", b"state")
        assert redis_plain.call("exists", "reame:l1:split") == "1" and kv_server.call("exists", "reame:l1:split") == "0"
        assert kv_server.call("exists", "reame:l3:{beef}") == "1" and redis_plain.call("exists", "reame:l3:{beef}") == "0"
        kv_server.kill()
        assert await archive.kv_get(b"beef") is None  # L3 away: a miss
        assert await archive.get(b"split") == b"answer"  # L1 unaffected
        assert archive.state() == "degraded" and archive.counters.errors["kv_get"] == 1
    finally:
        await archive.close()
        kv_server.kill()


@needs_redis
@pytest.mark.slow  # a Redis Cluster of real servers: the full suite's, not the fast tier's
async def test_a_cluster_over_tls_with_a_password(tmp_path, certs):
    nodes = RedisCluster(tmp_path / "tls-cluster", tls=certs, password="cluster-pw", replica=False)
    try:
        nodes.start()
        archive = RemoteArchive(address=parse_address(nodes.url("rediss+cluster").replace("://", "://:cluster-pw@")),
                                tls=TlsFiles(str(certs.ca), str(certs.client_cert), str(certs.client_key)),
                                timeout_ms=3000)
        await archive.start()
        try:
            assert archive.kind == "redis" and archive.state() == "ok"
            await tiers_round_trip(archive)
        finally:
            await archive.close()
    finally:
        nodes.stop()


@needs_redis
@pytest.mark.slow  # a Redis Cluster of real servers: the full suite's, not the fast tier's
async def test_a_cluster_that_comes_up_after_the_node(tmp_path):
    """Nodes may start before their cluster is formed: misses until then, then shared."""
    nodes = RedisCluster(tmp_path / "late-cluster", replica=False)
    archive = RemoteArchive(address=parse_address(nodes.url()), timeout_ms=3000)
    await archive.start()
    try:
        assert archive.state() == "degraded"
        assert await archive.get(b"early") is None
        nodes.start()
        deadline = asyncio.get_running_loop().time() + 30
        while archive.state() != "ok" and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert archive.state() == "ok"
        await archive.set(b"late", b"shared")
        assert await archive.get(b"late") == b"shared"
    finally:
        await archive.close()
        nodes.stop()


@needs_redis
async def test_the_mirror_resumes_a_redis_stream_from_its_persisted_cursor(redis_plain, tmp_path):
    from node.archive.mirror import CorpusMirror
    from node.speculative.palimpsest import Palimpsest

    ns = b"mirror-fp"
    archive = RemoteArchive(address=parse_address(f"redis://127.0.0.1:{redis_plain.port}"), timeout_ms=3000)
    path = tmp_path / "mirror" / "fp.l4"
    await archive.start()
    try:
        for i in range(5):
            await archive.observe(ns, [100 + i, 1, 2, 3, 4, 5])
        first: list[list[int]] = []
        mirror = CorpusMirror(archive, ns, first.append, path=path, interval_s=0.01)
        await mirror.start()
        assert await mirror.caught_up(10) and len(first) == 5
        await mirror.close()
        await archive.observe(ns, [200, 1, 2, 3])
        palimpsest = Palimpsest()
        again = CorpusMirror(archive, ns, palimpsest.add, path=path, interval_s=0.01)
        await again.start()  # the five from the local copy, only the new one through XRANGE
        assert again.streams == 5
        assert await again.caught_up(10) and again.streams == 6
        await again.close()
        palimpsest.ingest()
        assert palimpsest.continuation([104, 1, 2, 3], 2) == (4, 5) and palimpsest.stats().streams == 6
    finally:
        await archive.close()


async def test_an_arca_refusing_this_nodes_certificate_is_named_as_such(tmp_path, certs, caplog):
    """ARCA over TLS whose CA did not sign the node's certificate: the node's log says the
    server refused the certificate (the TLS alert), where it used to say only "Connection
    closed by server."."""
    from arca.launch import free_port
    from arca.tls import server_context
    from tests.arca.arca_harness import start_server

    caplog.set_level(logging.ERROR, logger="node.archive")
    context = server_context(str(certs.server_cert), str(certs.server_key), str(certs.ca), "yes")
    server = start_server(tmp_path / "arca", tls_port=free_port(), tls_context=context)
    try:
        archive = RemoteArchive(address=parse_address(f"rediss://127.0.0.1:{server.state.tls_port}"),
                                tls=TlsFiles(str(certs.ca), str(certs.stranger_cert), str(certs.stranger_key)),
                                timeout_ms=3000)
        await archive.start()
        try:
            assert archive.state() == "degraded"
            assert await archive.get(b"answer") is None
        finally:
            await archive.close()
    finally:
        server.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("client certificate refused by the server" in m and "UNKNOWN_CA" in m for m in errors), errors
