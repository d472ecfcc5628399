"""String commands through dispatch over a real archive: values, options, TTL handling, errors."""

from __future__ import annotations

import time

import pytest

from arca.protocol import ErrorReply, Status
from arca_harness import run

NOT_INT = ErrorReply("ERR value is not an integer or out of range")


def test_get_set_and_missing(ctx):
    assert run(ctx, "GET", "k") is None
    assert run(ctx, "SET", "k", b"\x00\xffbinary") == Status("OK")
    assert run(ctx, "get", "k") == b"\x00\xffbinary"
    stats = run(ctx, "INFO", "stats").decode()
    assert "keyspace_hits:1\r\n" in stats and "keyspace_misses:1\r\n" in stats


def test_set_conditions_and_get_option(ctx):
    assert run(ctx, "SET", "k", "v", "NX") == Status("OK")
    assert run(ctx, "SET", "k", "v2", "NX") is None
    assert run(ctx, "SET", "other", "v", "XX") is None
    assert run(ctx, "SET", "k", "v3", "XX", "GET") == b"v"
    assert run(ctx, "SET", "k", "v4", "GET") == b"v3"
    assert run(ctx, "SET", "k", "v5", "NX", "GET") == b"v4"
    assert run(ctx, "GET", "k") == b"v4"


@pytest.mark.parametrize(
    "argv, reply",
    [
        (("SET", "k", "v", "NX", "XX"), ErrorReply("ERR syntax error")),
        (("SET", "k", "v", "EX", "10", "PX", "5"), ErrorReply("ERR syntax error")),
        (("SET", "k", "v", "EX", "0"), ErrorReply("ERR invalid expire time in 'set' command")),
        (("SET", "k", "v", "EX", "ten"), NOT_INT),
        (("SET", "k", "v", "EX"), ErrorReply("ERR syntax error")),
        (("SET", "k", "v", "KEEPTTL", "EX", "5"), ErrorReply("ERR syntax error")),
        (("SET", "k", "v", "BOGUS"), ErrorReply("ERR syntax error")),
        (("SET", "k"), ErrorReply("ERR wrong number of arguments for 'set' command")),
    ],
)
def test_set_errors(ctx, argv, reply):
    assert run(ctx, *argv) == reply
    assert run(ctx, "EXISTS", "k") == 0


def test_set_expiry_forms_and_keepttl(ctx):
    now_ms = int(time.time() * 1000)
    run(ctx, "SET", "a", "1", "EX", "100")
    run(ctx, "SET", "b", "1", "PX", "100000")
    run(ctx, "SET", "c", "1", "EXAT", str(now_ms // 1000 + 100))
    run(ctx, "SET", "d", "1", "PXAT", str(now_ms + 100000))
    for key in "abcd":
        assert 95_000 <= run(ctx, "PTTL", key) <= 100_000
    run(ctx, "SET", "a", "2", "KEEPTTL")
    assert run(ctx, "TTL", "a") > 90
    run(ctx, "SET", "a", "3")
    assert run(ctx, "TTL", "a") == -1
    run(ctx, "SET", "past", "x", "PXAT", str(now_ms - 1000))
    assert run(ctx, "GET", "past") is None


def test_setnx_setex_psetex_getdel(ctx):
    assert run(ctx, "SETNX", "k", "a") == 1
    assert run(ctx, "SETNX", "k", "b") == 0
    assert run(ctx, "SETEX", "t", "100", "v") == Status("OK")
    assert 99 <= run(ctx, "TTL", "t") <= 100
    assert run(ctx, "PSETEX", "p", "100000", "v") == Status("OK")
    assert run(ctx, "SETEX", "t", "-1", "v") == ErrorReply("ERR invalid expire time in 'setex' command")
    assert run(ctx, "PSETEX", "t", "0", "v") == ErrorReply("ERR invalid expire time in 'psetex' command")
    assert run(ctx, "GETDEL", "k") == b"a"
    assert run(ctx, "GETDEL", "k") is None
    assert run(ctx, "EXISTS", "k") == 0


def test_mget_mset(ctx):
    assert run(ctx, "MSET", "a", "1", "b", "2") == Status("OK")
    assert run(ctx, "MGET", "a", "nope", "b") == [b"1", None, b"2"]
    assert run(ctx, "MSET", "a", "1", "b") == ErrorReply("ERR wrong number of arguments for 'mset' command")


def test_incr_family(ctx):
    assert run(ctx, "INCR", "n") == 1
    assert run(ctx, "INCRBY", "n", "41") == 42
    assert run(ctx, "DECR", "n") == 41
    assert run(ctx, "DECRBY", "n", "50") == -9
    assert run(ctx, "GET", "n") == b"-9"
    run(ctx, "SET", "s", "abc")
    assert run(ctx, "INCR", "s") == NOT_INT
    run(ctx, "SET", "s", " 1")
    assert run(ctx, "INCR", "s") == NOT_INT
    assert run(ctx, "INCRBY", "n", "1.5") == NOT_INT
    run(ctx, "SET", "big", str(2**63 - 1))
    assert run(ctx, "INCR", "big") == ErrorReply("ERR increment or decrement would overflow")
    assert run(ctx, "DECRBY", "n", str(-(2**63))) == ErrorReply("ERR decrement would overflow")


def test_incr_and_append_keep_the_ttl(ctx):
    run(ctx, "SET", "n", "1", "EX", "100")
    run(ctx, "INCR", "n")
    assert run(ctx, "TTL", "n") > 90
    run(ctx, "SET", "s", "ab", "EX", "100")
    assert run(ctx, "APPEND", "s", "cd") == 4
    assert run(ctx, "GET", "s") == b"abcd"
    assert run(ctx, "TTL", "s") > 90
    assert run(ctx, "APPEND", "new", "xyz") == 3
    assert run(ctx, "STRLEN", "new") == 3
    assert run(ctx, "STRLEN", "none") == 0


def test_value_larger_than_the_budget_is_an_oom_error(ctx):
    reply = run(ctx, "SET", "huge", b"x" * (9 << 20))
    assert isinstance(reply, ErrorReply) and reply.startswith("OOM ")


@pytest.mark.parametrize("amount", [b"", b" 1", b"+1", b"01", b"-0", b"1_0", b"1.0", b"9223372036854775808", b"\xff"])
def test_integers_must_be_written_canonically(ctx, amount):
    assert run(ctx, "INCRBY", "n", amount) == NOT_INT
    assert run(ctx, "GET", "n") is None
