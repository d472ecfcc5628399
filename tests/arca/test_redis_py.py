"""redis-py (the installed version) against ARCA: RESP3 and RESP2, sync and asyncio, pipelines."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry


@pytest.mark.parametrize("protocol", [3, 2])
def test_sync_client(arca, protocol):
    client = redis.Redis(host=arca.host, port=arca.port, protocol=protocol)
    try:
        assert client.ping() is True
        assert client.set("k", b"v\x00\xff") is True
        assert client.get("k") == b"v\x00\xff"
        assert client.get("missing") is None
        assert client.set("k", "new", nx=True) is None
        assert client.set("ttl", "v", ex=100) is True
        assert 99 <= client.ttl("ttl") <= 100
        assert client.incr("n") == 1 and client.incrby("n", 5) == 6
        assert client.mset({"a": "1", "b": "2"}) is True
        assert client.mget("a", "b", "zz") == [b"1", b"2", None]
        assert client.exists("a", "b", "zz") == 2
        assert client.delete("a", "b") == 2
        assert client.type("k") == b"string"
        assert set(client.scan_iter(match="*")) == {b"k", b"ttl", b"n"}
        assert client.dbsize() == 3
        assert client.client_setname("tester") is True
        assert client.client_getname() in ("tester", b"tester")  # redis-py decodes it for RESP2
        assert client.info("server")["redis_version"]
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("NOSUCH")
        assert client.ping() is True  # the connection survives an error reply
    finally:
        client.close()


@pytest.mark.parametrize("transaction", [False, True])
def test_pipelines(arca, transaction):
    client = redis.Redis(host=arca.host, port=arca.port)
    try:
        pipe = client.pipeline(transaction=transaction)
        for i in range(100):
            pipe.set(f"p{i}", i)
        pipe.get("p99").incr("counter").incr("counter")
        results = pipe.execute()
        assert results[:100] == [True] * 100 and results[100:] == [b"99", 1, 2]
    finally:
        client.close()


def test_password_with_redis_py(arca_factory):
    server = arca_factory(requirepass="pw")
    no_retry = Retry(NoBackoff(), 0)  # redis-py would otherwise retry a refused password with backoff
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=server.host, port=server.port, password="wrong", retry=no_retry).ping()
    for protocol in (2, 3):
        client = redis.Redis(host=server.host, port=server.port, password="pw", protocol=protocol)
        assert client.set("a", "1") and client.get("a") == b"1"
        client.close()


def test_asyncio_clients_concurrently(arca):
    async def worker(index: int, protocol: int) -> list:
        client = redis.asyncio.Redis(host=arca.host, port=arca.port, protocol=protocol)
        try:
            for i in range(50):
                await client.set(f"w{index}:{i}", i)
            async with client.pipeline(transaction=False) as pipe:
                for i in range(50):
                    pipe.get(f"w{index}:{i}")
                return await pipe.execute()
        finally:
            await client.aclose()

    async def main() -> list:
        return await asyncio.gather(*(worker(i, 2 + i % 2) for i in range(8)))

    for results in asyncio.run(main()):
        assert results == [str(i).encode() for i in range(50)]


def test_lru_eviction_under_the_budget(arca_factory):
    server = arca_factory(max_bytes=1 << 20)  # 1 MiB of L1
    client = redis.Redis(host=server.host, port=server.port)
    try:
        value = b"x" * 10_000
        for i in range(80):
            client.set(f"k{i}", value)
        assert client.get("k0") == value  # a read counts as use
        for i in range(80, 130):
            client.set(f"k{i}", value)
        assert client.exists("k0") == 1 and client.exists("k1") == 0
        assert client.exists("k129") == 1
        assert 50 < client.dbsize() < 105
        assert int(client.info("memory")["evicted_keys"]) > 0
        with pytest.raises(redis.exceptions.OutOfMemoryError, match="used memory"):
            client.set("huge", b"y" * (2 << 20))
    finally:
        client.close()


def test_instantaneous_ops_per_sec_follows_the_load(arca):
    """INFO stats samples the command count every 100 ms over 1.6 s, as Redis does, so
    monitoring tools reading instantaneous_ops_per_sec see the load."""
    client = redis.Redis(host=arca.host, port=arca.port)
    try:
        deadline = time.monotonic() + 1.2
        with client.pipeline(transaction=False) as pipe:
            while time.monotonic() < deadline:
                for i in range(200):
                    pipe.set(b"k%d" % i, b"v")
                pipe.execute()
        busy = int(client.info("stats")["instantaneous_ops_per_sec"])
        assert busy > 1000
        time.sleep(2.0)  # a window with nothing but the INFO below
        assert int(client.info("stats")["instantaneous_ops_per_sec"]) < busy / 10
    finally:
        client.close()


@pytest.mark.parametrize("protocol", [3, 2])
def test_redis_py_finds_the_keys_of_commands_as_its_cluster_client_does(arca, protocol):
    """redis-py's cluster client routes a command by its keys, which its CommandsParser
    reads from COMMAND (key positions) and, for what those do not settle, COMMAND GETKEYS."""
    from redis._parsers.commands import CommandsParser  # what RedisCluster uses

    client = redis.Redis(host=arca.host, port=arca.port, protocol=protocol)
    try:
        parser = CommandsParser(client)
        assert parser.get_keys(client, "MSET", "a", "1", "b", "2") == ["a", "b"]
        assert parser.get_keys(client, "GET", "k") == ["k"]
        assert parser.get_keys(client, "EXISTS", "a", "b") == ["a", "b"]
        assert parser.get_keys(client, "LCS", "a", "b") == ["a", "b"]
        assert parser.get_keys(client, "OBJECT", "ENCODING", "k") == ["k"]
        assert parser.get_keys(client, "MEMORY", "USAGE", "k") == ["k"]
        assert parser.get_keys(client, "PING") is None
        assert client.command_getkeys("SET", "k", "v", "EX", "10") in (["k"], [b"k"])
        names = client.command_list()
        assert client.command_count() == len([name for name in names if "|" not in str(name)])
        assert {"config|get", "client|list"} <= {n.decode() if isinstance(n, bytes) else n for n in names}
    finally:
        client.close()
