"""SETBIT GETBIT BITCOUNT BITPOS, COPY RENAME RENAMENX RANDOMKEY TOUCH EXPIRETIME, OBJECT and
MEMORY through dispatch over a real archive."""

from __future__ import annotations

import pytest

from arca.protocol import ErrorReply, Status
from arca_harness import run

OK = Status("OK")
SYNTAX = ErrorReply("ERR syntax error")
BAD_OFFSET = ErrorReply("ERR bit offset is not an integer or out of range")


def test_setbit_getbit_grow_and_keep_the_ttl(ctx):
    assert run(ctx, "SETBIT", "b", "7", "1") == 0
    assert run(ctx, "GET", "b") == b"\x01"
    assert run(ctx, "SETBIT", "b", "7", "0") == 1
    assert run(ctx, "SETBIT", "b", "0", "1") == 0 and run(ctx, "SETBIT", "b", "0", "1") == 1
    assert run(ctx, "SETBIT", "b", "23", "1") == 0
    assert run(ctx, "GET", "b") == b"\x80\x00\x01"
    assert [run(ctx, "GETBIT", "b", str(i)) for i in (0, 1, 23, 24, 1000)] == [1, 0, 1, 0, 0]
    assert run(ctx, "GETBIT", "nokey", "3") == 0
    run(ctx, "SET", "t", "a", "EX", "100")
    run(ctx, "SETBIT", "t", "15", "1")
    assert run(ctx, "GET", "t") == b"a\x01" and run(ctx, "TTL", "t") > 0


@pytest.mark.parametrize("argv, error", [
    (("SETBIT", "b", "-1", "1"), BAD_OFFSET),
    (("SETBIT", "b", "x", "1"), BAD_OFFSET),
    (("SETBIT", "b", str(8 * (64 << 20)), "1"), BAD_OFFSET),  # byte 64 MiB: past proto-max-bulk-len
    (("SETBIT", "b", "1", "2"), ErrorReply("ERR bit is not an integer or out of range")),
    (("SETBIT", "b", "1", "x"), ErrorReply("ERR bit is not an integer or out of range")),
    (("GETBIT", "b", "-1"), BAD_OFFSET),
    (("SETBIT", "b", "1"), ErrorReply("ERR wrong number of arguments for 'setbit' command")),
])
def test_bit_errors(ctx, argv, error):
    assert run(ctx, *argv) == error
    assert run(ctx, "EXISTS", "b") == 0


def test_bitcount_ranges(ctx):
    run(ctx, "SET", "s", "foobar")
    cases = {(): 26, ("0", "0"): 4, ("1", "1"): 6, ("1", "1", "BYTE"): 6, ("5", "30", "BIT"): 17,
             ("-2", "-1"): 7, ("-1", "-2"): 0, ("-100", "-200"): 0, ("0", "9223372036854775807"): 26,
             ("47", "47", "BIT"): 0, ("-9", "-1", "bit"): 5}
    for args, expected in cases.items():
        assert run(ctx, "BITCOUNT", "s", *args) == expected, args
    assert run(ctx, "BITCOUNT", "s", "0") == SYNTAX
    assert run(ctx, "BITCOUNT", "s", "0", "1", "WORD") == SYNTAX
    assert run(ctx, "BITCOUNT", "s", "a", "1") == ErrorReply("ERR value is not an integer or out of range")
    assert run(ctx, "BITCOUNT", "nokey", "0") == 0  # a missing key answers before its arguments are read


def test_bitpos(ctx):
    run(ctx, "SET", "p", b"\xff\xf0\x00")
    cases = {("0",): 12, ("1",): 0, ("1", "1"): 8, ("1", "2"): -1, ("0", "2", "-1"): 16,
             ("1", "7", "15", "BIT"): 7, ("0", "0", "11", "BIT"): -1, ("1", "-100", "-200"): 0,
             ("1", "3", "1"): -1}
    for args, expected in cases.items():
        assert run(ctx, "BITPOS", "p", *args) == expected, args
    run(ctx, "SET", "ones", b"\xff\xff")
    assert run(ctx, "BITPOS", "ones", "0") == 16  # no end given: the zeros past the value count
    assert run(ctx, "BITPOS", "ones", "0", "0", "-1") == -1
    assert run(ctx, "BITPOS", "nokey", "1") == -1 and run(ctx, "BITPOS", "nokey", "0") == 0
    assert run(ctx, "BITPOS", "p", "2") == ErrorReply("ERR The bit argument must be 1 or 0.")
    assert run(ctx, "BITPOS", "p", "1", "0", "1", "BIT", "x") == SYNTAX


def test_copy_keeps_value_and_ttl(ctx):
    run(ctx, "SET", "a", "1", "EX", "100")
    run(ctx, "SET", "b", "2")
    assert run(ctx, "COPY", "a", "c") == 1 and run(ctx, "GET", "c") == b"1" and run(ctx, "TTL", "c") > 0
    assert run(ctx, "COPY", "a", "b") == 0 and run(ctx, "GET", "b") == b"2"
    assert run(ctx, "COPY", "a", "b", "REPLACE", "DB", "0") == 1 and run(ctx, "GET", "b") == b"1"
    assert run(ctx, "COPY", "nokey", "d") == 0
    assert run(ctx, "COPY", "a", "a") == ErrorReply("ERR source and destination objects are the same")
    assert run(ctx, "COPY", "a", "d", "DB", "1") == ErrorReply("ERR DB index is out of range")
    assert run(ctx, "COPY", "a", "d", "DB", "x") == ErrorReply("ERR value is not an integer or out of range")
    assert run(ctx, "COPY", "a", "d", "DB") == SYNTAX
    assert run(ctx, "EXISTS", "d") == 0


def test_rename_and_renamenx(ctx):
    run(ctx, "SET", "a", "1", "EX", "100")
    run(ctx, "SET", "b", "2")
    assert run(ctx, "RENAME", "nokey", "x") == ErrorReply("ERR no such key")
    assert run(ctx, "RENAMENX", "nokey", "x") == ErrorReply("ERR no such key")
    assert run(ctx, "RENAME", "a", "a") == OK and run(ctx, "RENAMENX", "a", "a") == 0
    assert run(ctx, "RENAME", "a", "z") == OK
    assert run(ctx, "EXISTS", "a") == 0 and run(ctx, "GET", "z") == b"1" and run(ctx, "TTL", "z") > 0
    assert run(ctx, "RENAMENX", "z", "b") == 0 and run(ctx, "GET", "z") == b"1"
    assert run(ctx, "RENAMENX", "z", "y") == 1 and run(ctx, "EXISTS", "z") == 0
    assert run(ctx, "RENAME", "y", "b") == OK and run(ctx, "GET", "b") == b"1"
    assert run(ctx, "DBSIZE") == 1


def test_randomkey_and_touch(ctx):
    assert run(ctx, "RANDOMKEY") is None
    run(ctx, "MSET", "a", "1", "b", "2", "c", "3")
    assert {run(ctx, "RANDOMKEY") for _ in range(200)} == {b"a", b"b", b"c"}
    run(ctx, "PEXPIRE", "a", "1")
    run(ctx, "PEXPIRE", "b", "1")
    import time

    time.sleep(0.01)
    assert run(ctx, "RANDOMKEY") == b"c"  # expired keys are never picked
    assert run(ctx, "TOUCH", "c", "a", "nokey", "c") == 2


def test_touch_moves_a_key_to_the_recent_end(ctx):
    run(ctx, "MSET", "old", "1", "new", "2")
    run(ctx, "TOUCH", "old")
    assert list(ctx.archive.keys())[-1] == b"old"


def test_expiretime(ctx):
    run(ctx, "SET", "k", "v")
    assert run(ctx, "EXPIRETIME", "k") == -1 and run(ctx, "PEXPIRETIME", "k") == -1
    assert run(ctx, "EXPIRETIME", "nokey") == -2 and run(ctx, "PEXPIRETIME", "nokey") == -2
    run(ctx, "PEXPIREAT", "k", "4102444800999")
    assert run(ctx, "EXPIRETIME", "k") == 4102444801 and run(ctx, "PEXPIRETIME", "k") == 4102444800999  # rounded


def test_expire_amounts_that_overflow_in_milliseconds(ctx):
    run(ctx, "SET", "k", "v")
    for name, amount in (("EXPIRE", "-9223372036854776"), ("EXPIRE", "9223372036854776"),
                         ("EXPIREAT", "-9223372036854776"), ("PEXPIRE", "9223372036854775807")):
        assert run(ctx, name, "k", amount) == ErrorReply(f"ERR invalid expire time in '{name.lower()}' command")
        assert run(ctx, name, "nokey", amount) == ErrorReply(f"ERR invalid expire time in '{name.lower()}' command")
    assert run(ctx, "TTL", "k") == -1
    assert run(ctx, "SET", "k", "v", "EX", "9223372036854776") == ErrorReply("ERR invalid expire time in 'set' command")
    assert run(ctx, "EXPIRE", "k", "-9223372036854775") == 1 and run(ctx, "EXISTS", "k") == 0


def test_object_encodings(ctx):
    values = {"12345": b"int", "-9223372036854775808": b"int", "9223372036854775808": b"embstr",
              "-0": b"embstr", "012": b"embstr", "+1": b"embstr", "x" * 44: b"embstr", "x" * 45: b"raw",
              "": b"embstr"}
    for i, (value, encoding) in enumerate(values.items()):
        run(ctx, "SET", f"k{i}", value)
        assert run(ctx, "OBJECT", "ENCODING", f"k{i}") == encoding, value
    assert run(ctx, "OBJECT", "ENCODING", "nokey") is None
    assert run(ctx, "OBJECT", "REFCOUNT", "k0") == 1 and run(ctx, "OBJECT", "IDLETIME", "k0") == 0
    assert run(ctx, "OBJECT", "FREQ", "nokey") is None
    assert run(ctx, "OBJECT", "FREQ", "k0").startswith("ERR An LFU maxmemory policy is not selected")
    assert run(ctx, "OBJECT", "FOO") == ErrorReply("ERR unknown subcommand 'FOO'. Try OBJECT HELP.")
    help_lines = run(ctx, "OBJECT", "HELP")
    assert any(line.startswith(b"ENCODING") for line in help_lines)


def test_memory_usage_counts_the_budget_bytes(ctx):
    run(ctx, "SET", "key", "x" * 100)
    assert run(ctx, "MEMORY", "USAGE", "key") == 3 + 100 + 128
    assert run(ctx, "MEMORY", "USAGE", "key", "SAMPLES", "5") == 3 + 100 + 128
    assert run(ctx, "MEMORY", "USAGE", "nokey") is None
    assert run(ctx, "MEMORY", "USAGE", "key", "SAMPLES") == SYNTAX
    assert isinstance(run(ctx, "MEMORY", "HELP"), list)


def test_other_types_stay_unknown_commands(ctx):
    for name in ("LPUSH", "SADD", "HSET", "ZADD", "XADD", "PFADD"):
        assert run(ctx, name, "k", "v") == ErrorReply(
            f"ERR unknown command '{name}', with args beginning with: 'k' 'v' ")


def test_new_commands_are_in_command_info_and_docs(ctx):
    names = set(run(ctx, "COMMAND", "LIST"))
    new = {b"getex", b"getset", b"getrange", b"substr", b"setrange", b"msetnx", b"incrbyfloat", b"lcs",
           b"setbit", b"getbit", b"bitcount", b"bitpos", b"expiretime", b"pexpiretime", b"copy", b"rename",
           b"renamenx", b"randomkey", b"touch", b"object", b"memory", b"watch", b"unwatch", b"slowlog"}
    assert new <= names
    assert run(ctx, "COMMAND", "COUNT") == len({name for name in names if b"|" not in name})  # LIST adds subcommands
    info = run(ctx, "COMMAND", "INFO", "lcs", "shutdown")
    assert info[0][:2] == [b"lcs", -3]
    assert Status("no_multi") in info[1][2]
    docs = run(ctx, "COMMAND", "DOCS", "getex")
    assert docs[b"getex"][b"arguments"][0][b"name"] == b"key"
