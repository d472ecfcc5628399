"""Key commands through dispatch over a real archive: DEL/EXISTS, TTLs, TYPE, KEYS globs, SCAN."""

from __future__ import annotations

import time

import pytest

from arca.commands.glob import compile_glob
from arca.protocol import ErrorReply, Status
from arca_harness import run


def test_del_unlink_exists_count_each_key(ctx):
    run(ctx, "MSET", "a", "1", "b", "2", "c", "3")
    assert run(ctx, "EXISTS", "a", "a", "nope") == 2
    assert run(ctx, "DEL", "a", "nope") == 1
    assert run(ctx, "UNLINK", "b", "c") == 2
    assert run(ctx, "DBSIZE") == 0


def test_ttl_lifecycle(ctx):
    assert run(ctx, "TTL", "k") == -2
    run(ctx, "SET", "k", "v")
    assert run(ctx, "TTL", "k") == -1
    assert run(ctx, "EXPIRE", "k", "100") == 1
    assert run(ctx, "TTL", "k") == 100
    assert 99_000 < run(ctx, "PTTL", "k") <= 100_000
    assert run(ctx, "PERSIST", "k") == 1
    assert run(ctx, "PERSIST", "k") == 0
    assert run(ctx, "EXPIRE", "missing", "10") == 0
    assert run(ctx, "PEXPIREAT", "k", str(int(time.time() * 1000) + 50_000)) == 1
    assert 45 <= run(ctx, "TTL", "k") <= 50
    assert run(ctx, "EXPIREAT", "k", str(int(time.time()) + 500)) == 1
    assert run(ctx, "PEXPIRE", "k", "-1") == 1  # a past expiry deletes the key
    assert run(ctx, "EXISTS", "k") == 0


def test_keys_expire_for_real(ctx):
    run(ctx, "SET", "short", "v", "PX", "50")
    run(ctx, "SET", "long", "v")
    time.sleep(0.12)
    assert run(ctx, "GET", "short") is None
    assert run(ctx, "TTL", "short") == -2
    assert run(ctx, "KEYS", "*") == [b"long"]


def test_expire_options(ctx):
    run(ctx, "SET", "k", "v")
    assert run(ctx, "EXPIRE", "k", "100", "XX") == 0
    assert run(ctx, "EXPIRE", "k", "100", "NX") == 1
    assert run(ctx, "EXPIRE", "k", "200", "NX") == 0
    assert run(ctx, "EXPIRE", "k", "50", "GT") == 0
    assert run(ctx, "EXPIRE", "k", "200", "GT") == 1
    assert run(ctx, "EXPIRE", "k", "300", "LT") == 0
    assert run(ctx, "EXPIRE", "k", "10", "LT") == 1
    assert run(ctx, "EXPIRE", "k", "10", "NX", "XX") == ErrorReply(
        "ERR NX and XX, GT or LT options at the same time are not compatible")
    assert run(ctx, "EXPIRE", "k", "10", "GT", "LT") == ErrorReply(
        "ERR GT and LT options at the same time are not compatible")
    assert run(ctx, "EXPIRE", "k", "10", "SOON") == ErrorReply("ERR Unsupported option SOON")
    assert run(ctx, "EXPIRE", "k", "x") == ErrorReply("ERR value is not an integer or out of range")
    assert run(ctx, "EXPIRE", "k", str(2**62)) == ErrorReply("ERR invalid expire time in 'expire' command")


def test_type(ctx):
    run(ctx, "SET", "k", "v")
    assert run(ctx, "TYPE", "k") == Status("string")
    assert run(ctx, "TYPE", "nope") == Status("none")


@pytest.mark.parametrize(
    "pattern, key, matches",
    [
        ("*", "anything", True),
        ("h?llo", "hello", True),
        ("h?llo", "hllo", False),
        ("h*llo", "heeeello", True),
        ("h[ae]llo", "hallo", True),
        ("h[ae]llo", "hillo", False),
        ("h[^e]llo", "hallo", True),
        ("h[^e]llo", "hello", False),
        ("h[a-b]llo", "hbllo", True),
        ("h[a-b]llo", "hcllo", False),
        ("h\\*llo", "h*llo", True),
        ("h\\*llo", "hello", False),
        ("user:*:name", "user:42:name", True),
        ("a.b", "axb", False),
        ("line*", "line1\nline2", True),
    ],
)
def test_glob_matches_like_redis(pattern, key, matches):
    assert bool(compile_glob(pattern.encode())(key.encode())) is matches


def test_keys_pattern(ctx):
    run(ctx, "MSET", "user:1", "a", "user:2", "b", "item:1", "c")
    assert sorted(run(ctx, "KEYS", "user:*")) == [b"user:1", b"user:2"]
    assert run(ctx, "KEYS", "nomatch*") == []


def test_scan_is_complete_and_filters(ctx):
    keys = {b"key:%d" % i for i in range(1000)}
    for key in keys:
        run(ctx, "SET", key, "v")
    seen: list[bytes] = []
    cursor = b"0"
    rounds = 0
    while True:
        cursor, batch = run(ctx, "SCAN", cursor, "COUNT", "37")
        seen += batch
        rounds += 1
        if cursor == b"0":
            break
    assert set(seen) == keys
    assert rounds > 10
    cursor, batch = b"0", []
    matched: list[bytes] = []
    while True:
        cursor, batch = run(ctx, "SCAN", cursor, "MATCH", "key:99*", "COUNT", "100")
        matched += batch
        if cursor == b"0":
            break
    assert sorted(matched) == sorted([b"key:99"] + [b"key:99%d" % i for i in range(10)])
    assert run(ctx, "SCAN", "0", "TYPE", "hash")[1] == []
    assert run(ctx, "SCAN", "abc") == ErrorReply("ERR invalid cursor")
    assert run(ctx, "SCAN", "0", "COUNT", "0") == ErrorReply("ERR syntax error")
    assert run(ctx, "SCAN", "0", "MATCH") == ErrorReply("ERR syntax error")


def test_scan_survives_writes_between_calls(ctx):
    """Keys present for the whole iteration are all returned even while others come and go."""
    stable = {b"stable:%d" % i for i in range(300)}
    for key in stable:
        run(ctx, "SET", key, "v")
    seen: set[bytes] = set()
    cursor, step = b"0", 0
    while True:
        cursor, batch = run(ctx, "SCAN", cursor, "COUNT", "20")
        seen |= set(batch)
        run(ctx, "SET", b"churn:%d" % step, "v")
        run(ctx, "DEL", b"churn:%d" % (step - 3))
        step += 1
        if cursor == b"0":
            break
    assert stable <= seen


def test_ttl_type_exists_and_object_leave_a_key_where_it_is_in_the_lru_order(ctx):
    """Redis's TTL, TYPE, EXISTS and OBJECT do not touch a key's LRU clock (its suite checks
    OBJECT IDLETIME after them); here the key keeps its place in the LRU order, so it is
    still the one a write evicts first. A GET or TOUCH does move it."""
    run(ctx, "SET", "old", "1")
    run(ctx, "SET", "new", "2")
    for argv in (("TTL", "old"), ("PTTL", "old"), ("EXPIRETIME", "old"), ("PEXPIRETIME", "old"),
                 ("TYPE", "old"), ("EXISTS", "old"), ("OBJECT", "ENCODING", "old"), ("OBJECT", "REFCOUNT", "old"),
                 ("OBJECT", "IDLETIME", "old"), ("MEMORY", "USAGE", "old")):
        run(ctx, *argv)
        assert run(ctx, "KEYS", "*") == [b"old", b"new"], argv  # least recently used first
    run(ctx, "TOUCH", "old")
    assert run(ctx, "KEYS", "*") == [b"new", b"old"]
    run(ctx, "GET", "new")
    assert run(ctx, "KEYS", "*") == [b"old", b"new"]
