"""The newer string and keyspace commands through redis-py (RESP2 and RESP3) and redis-cli."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import redis

REDIS_CLI = shutil.which("redis-cli")


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py(arca, protocol):
    client = redis.Redis(host=arca.host, port=arca.port, protocol=protocol)
    try:
        client.set("k", "hello")
        assert client.getex("k", ex=100) == b"hello" and 99 <= client.ttl("k") <= 100
        assert client.getex("k", persist=True) == b"hello" and client.ttl("k") == -1
        assert client.getset("k", "world") == b"hello"
        assert client.getrange("k", 1, -2) == b"orl" and client.substr("k", 0, 0) == b"w"
        assert client.setrange("k", 5, "!!") == 7 and client.get("k") == b"world!!"
        assert client.msetnx({"a": "1", "b": "2"}) is True and client.msetnx({"a": "3", "c": "4"}) is False
        assert client.incrbyfloat("f", 0.1) == pytest.approx(0.1) and client.get("f") == b"0.1"
        client.mset({"l1": "ohmytext", "l2": "mynewtext"})
        assert client.lcs("l1", "l2") == b"mytext" and client.lcs("l1", "l2", len=True) == 6
        idx = client.lcs("l1", "l2", idx=True, minmatchlen=4, withmatchlen=True)
        assert idx in ([b"matches", [[[4, 7], [5, 8], 4]], b"len", 6], {b"matches": [[[4, 7], [5, 8], 4]], b"len": 6})
        assert client.setbit("bits", 7, 1) == 0 and client.getbit("bits", 7) == 1
        assert client.bitcount("bits") == 1 and client.bitpos("bits", 1) == 7
        assert client.bitcount("bits", 0, 7, "BIT") == 1
        client.expireat("a", 4102444800)
        assert client.expiretime("a") == 4102444800 and client.pexpiretime("a") == 4102444800000
        assert client.expire("a", 10, gt=True) is False and client.expire("b", 10, nx=True) is True
        assert client.copy("a", "a2") is True and client.ttl("a2") > 0
        assert client.rename("a2", "a3") is True and client.renamenx("a3", "b") is False
        assert client.touch("a", "b", "nope") == 2
        assert client.randomkey() is not None
        assert client.object("encoding", "a") == b"int" and client.object("refcount", "a") == 1
        assert client.object("idletime", "a") == 0
        assert client.memory_usage("a") == 1 + 1 + 128
        with pytest.raises(redis.ResponseError, match="invalid expire time in 'expire' command"):
            client.expire("k", -9223372036854776)
        with pytest.raises(redis.ResponseError, match="unknown command 'LPUSH'"):
            client.lpush("list", "x")
    finally:
        client.flushall()
        client.close()


def cli(server, *args: str) -> str:
    done = subprocess.run([REDIS_CLI, "-h", server.host, "-p", str(server.port), *args],
                          capture_output=True, timeout=30)
    return done.stdout.decode()


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli not installed (apt-get install redis-tools)")
def test_redis_cli(arca):
    assert cli(arca, "SET", "k", "hello") == "OK\n"
    assert cli(arca, "GETRANGE", "k", "-3", "-1") == "llo\n"
    assert cli(arca, "SETRANGE", "k", "0", "J") == "5\n"
    assert cli(arca, "INCRBYFLOAT", "f", "1.5") == "1.5\n"
    assert cli(arca, "SETBIT", "b", "0", "1") == "0\n"
    assert cli(arca, "BITCOUNT", "b") == "1\n"
    assert cli(arca, "OBJECT", "ENCODING", "k") == "raw\n"  # SETRANGE modified it in place, as Redis reports
    assert cli(arca, "MSET", "l1", "ohmytext", "l2", "mynewtext") == "OK\n"
    assert cli(arca, "LCS", "l1", "l2", "IDX") == "matches\n4\n7\n5\n8\n2\n3\n0\n1\nlen\n6\n"
    assert cli(arca, "EXPIRE", "k", "-9223372036854776").strip() == "ERR invalid expire time in 'expire' command"
    session = subprocess.run([REDIS_CLI, "-h", arca.host, "-p", str(arca.port)], capture_output=True, timeout=30,
                             input=b"WATCH k\nSET k other\nMULTI\nGET k\nEXEC\nSLOWLOG LEN\n")
    assert session.stdout.decode().split("\n")[:5] == ["OK", "OK", "OK", "QUEUED", ""]
    assert cli(arca, "COMMAND", "INFO", "getex").split("\n")[:2] == ["getex", "-2"]
