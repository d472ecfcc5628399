"""Command sequences whose replies must be byte-identical on ARCA and redis-server.

Each script runs from an empty keyspace. Only deterministic replies belong here: no sizes
(MEMORY USAGE), no clocks beyond whole seconds just after they are set, no random picks
among several keys, no help texts.
"""

from __future__ import annotations

MAX = "9223372036854775807"
MIN = "-9223372036854775808"
FAR = "4102444800"  # 2100-01-01 in unix seconds

SCRIPTS: dict[str, list[tuple]] = {
    "expire-overflow": [
        ("EXPIRE", "k", "-9223372036854776"), ("SET", "k", "v"),
        ("EXPIRE", "k", "-9223372036854776"), ("EXPIRE", "k", "9223372036854776"),
        ("PEXPIRE", "k", MAX), ("PEXPIRE", "k", MIN), ("EXPIREAT", "k", "9223372036854776"),
        ("EXPIREAT", "k", "-9223372036854776"), ("PEXPIREAT", "k", MAX), ("EXISTS", "k"),
        ("SET", "k", "v"), ("EXPIRE", "k", "-9223372036854775"), ("EXISTS", "k"),
        ("SET", "k", "v", "EX", "9223372036854775"), ("SET", "k", "v", "EX", "9223372036854776"),
        ("SET", "k", "v", "PX", MAX), ("SET", "k", "v", "EXAT", "9223372036854776"),
        ("SET", "k", "v", "PXAT", MAX), ("SETEX", "k", "9223372036854776", "v"),
        ("PSETEX", "k", MAX, "v"), ("SET", "k", "v"), ("GETEX", "k", "EX", "9223372036854776"),
        ("GETEX", "k", "PX", MAX), ("GETEX", "k", "EXAT", "9223372036854776"), ("TTL", "k"),
        ("EXPIRE", "k", "x"), ("EXPIRE", "k", "10", "FOO"), ("EXPIRE", "k", "10", "NX", "XX"),
        ("EXPIRE", "k", "10", "GT", "LT"), ("EXPIRE", "k"),
    ],
    "expire-options": [
        ("SET", "k", "v"), ("EXPIRE", "k", "100", "XX"), ("EXPIRE", "k", "100", "GT"),
        ("EXPIRE", "k", "100", "LT"), ("TTL", "k"), ("EXPIRE", "k", "200", "NX"),
        ("EXPIRE", "k", "50", "GT"), ("EXPIRE", "k", "500", "GT"), ("TTL", "k"),
        ("EXPIRE", "k", "600", "LT"), ("EXPIRE", "k", "300", "LT"), ("TTL", "k"),
        ("EXPIRE", "k", "400", "XX", "GT"), ("PEXPIRE", "k", "500000", "xx", "gt"), ("TTL", "k"),
        ("EXPIREAT", "k", FAR, "NX"), ("EXPIREAT", "k", FAR, "GT"), ("EXPIRETIME", "k"),
        ("PEXPIRETIME", "k"), ("PEXPIREAT", "k", FAR + "000", "LT"), ("PEXPIRETIME", "k"),
        ("PERSIST", "k"), ("EXPIRETIME", "k"), ("PEXPIRETIME", "k"), ("EXPIRETIME", "nokey"),
        ("PEXPIRETIME", "nokey"), ("EXPIRE", "nokey", "10", "NX"), ("EXPIRE", "k", "0", "NX"),
        ("EXISTS", "k"), ("EXPIRETIME",), ("EXPIRETIME", "a", "b"),
    ],
    "getex": [
        ("GETEX", "nokey"), ("GETEX", "nokey", "EX", "0"), ("GETEX", "nokey", "EX", "abc"),
        ("GETEX", "nokey", "EX", "10", "PX", "10"), ("GETEX", "nokey", "FOO"), ("SET", "k", "hello"),
        ("GETEX", "k"), ("GETEX", "k", "EX", "0"), ("GETEX", "k", "EX", "-1"), ("GETEX", "k", "PX", "0"),
        ("GETEX", "k", "EX"), ("GETEX", "k", "EX", "abc"), ("GETEX", "k", "EX", "100", "PERSIST"),
        ("GETEX", "k", "PERSIST", "PERSIST"), ("GETEX", "k", "EX", "10", "EX", "20"), ("TTL", "k"),
        ("GETEX", "k", "EX", "10", "PX", "20"), ("GETEX", "k", "PERSIST", "EX", "10"), ("GETEX", "k", "PERSIST"), ("TTL", "k"),
        ("GETEX", "k", "EX", "100"), ("TTL", "k"), ("GETEX", "k", "px", "200000"), ("TTL", "k"),
        ("GETEX", "k", "EXAT", FAR), ("EXPIRETIME", "k"), ("GETEX", "k", "PXAT", FAR + "123"),
        ("PEXPIRETIME", "k"), ("GETEX", "k", "PERSIST"), ("TTL", "k"), ("GETEX", "k", "EXAT", "1"),
        ("EXISTS", "k"), ("SET", "k", "v"), ("GETEX", "k", "PXAT", "1"), ("EXISTS", "k"), ("GETEX",),
    ],
    "set-options": [
        ("SET", "k", "v", "EX", "10", "EX", "20"), ("TTL", "k"), ("SET", "k", "v", "NX", "NX"),
        ("SET", "k", "w", "GET", "GET"), ("SET", "k", "v", "KEEPTTL", "KEEPTTL"), ("TTL", "k"),
        ("SET", "k", "v", "XX", "NX"), ("SET", "k", "v", "EX", "10", "PX", "10"),
        ("SET", "k", "v", "KEEPTTL", "EX", "10"), ("SET", "k", "v", "EX", "10", "KEEPTTL"),
        ("SET", "k", "v", "XX", "XX", "GET"), ("SET", "k", "v", "PX", "5000", "PX", "100000"), ("TTL", "k"),
    ],
    "getset-msetnx": [
        ("GETSET", "k", "a"), ("GETSET", "k", "b"), ("GET", "k"), ("SET", "t", "v", "EX", "100"),
        ("GETSET", "t", "w"), ("TTL", "t"), ("GETSET", "k"), ("MSETNX", "a", "1", "b", "2"),
        ("MGET", "a", "b"), ("MSETNX", "a", "9", "c", "3"), ("EXISTS", "c"), ("MSETNX", "a"),
        ("MSETNX", "x", "1", "y"), ("MSETNX", "d", "1", "d", "2"), ("GET", "d"),
        ("MSETNX", "e", "1", "a", "2"), ("EXISTS", "e"), ("MSETNX",),
    ],
    "getrange": [
        ("GETRANGE", "nokey", "0", "-1"), ("GETRANGE", "nokey", "x", "1"), ("SET", "k", "hello"),
        ("GETRANGE", "k", "0", "-1"), ("GETRANGE", "k", "-100", "-200"), ("GETRANGE", "k", "-1", "-5"),
        ("GETRANGE", "k", "3", "1"), ("GETRANGE", "k", "1", "100"), ("GETRANGE", "k", "-3", "-1"),
        ("GETRANGE", "k", "0", MAX), ("GETRANGE", "k", MIN, "2"), ("GETRANGE", "k", "a", "1"),
        ("GETRANGE", "k", "1", "b"), ("GETRANGE", "k", "5", "10"), ("GETRANGE", "k", "4", "4"),
        ("GETRANGE", "k", "-200", "-100"), ("GETRANGE", "k", "-5", "0"), ("GETRANGE", "k", "0", "-6"),
        ("GETRANGE", "k", "-6", "-6"), ("GETRANGE", "k", "0", "0"), ("SUBSTR", "k", "1", "2"),
        ("SUBSTR", "k", "-2", "-1"), ("SUBSTR", "k", "1"), ("GETRANGE", "k", "1"), ("SET", "e", ""),
        ("GETRANGE", "e", "0", "-1"), ("GETRANGE", "e", "0", "0"), ("GETRANGE", "e", "-1", "0"),
        ("SET", "n", "12345"), ("GETRANGE", "n", "1", "3"),
    ],
    "setrange": [
        ("SETRANGE", "k", "-1", "x"), ("SETRANGE", "nokey", "0", ""), ("EXISTS", "nokey"),
        ("SETRANGE", "nokey", "67108864", ""), ("SETRANGE", "nokey", "67108864", "x"),
        ("SETRANGE", "nokey", "-1", ""), ("SETRANGE", "k", "a", "b"), ("SET", "k", "hello"),
        ("SETRANGE", "k", "0", ""), ("SETRANGE", "k", "67108864", ""), ("SETRANGE", "k", "1", "EL"),
        ("GET", "k"), ("SETRANGE", "k", "7", "ab"), ("GET", "k"), ("SETRANGE", "k", "67108863", "xy"),
        ("SETRANGE", "k", MAX, "x"), ("SETRANGE", "k2", "3", "ab"), ("GET", "k2"), ("STRLEN", "k2"),
        ("SET", "t", "abc", "EX", "100"), ("SETRANGE", "t", "1", "X"), ("TTL", "t"), ("GET", "t"),
        ("SET", "n", "123"), ("SETRANGE", "n", "1", "9"), ("GET", "n"), ("INCR", "n"),
        ("SETRANGE", "k", "0"), ("SETRANGE", "k", "0", "a", "b"),
    ],
    "incrbyfloat": [
        ("INCRBYFLOAT", "f", "10.5"), ("INCRBYFLOAT", "f", "0.1"), ("INCRBYFLOAT", "f", "-5"),
        ("INCRBYFLOAT", "f", "5.0e3"), ("INCRBYFLOAT", "f", "2.0e-3"), ("INCRBYFLOAT", "g", "0.1"),
        ("INCRBYFLOAT", "g", "0.2"), ("GET", "g"), ("INCRBYFLOAT", "f", "abc"), ("INCRBYFLOAT", "f", ""),
        ("INCRBYFLOAT", "f", " 1"), ("INCRBYFLOAT", "f", "1 "), ("INCRBYFLOAT", "f", "nan"),
        ("INCRBYFLOAT", "f", "inf"), ("INCRBYFLOAT", "f", "-inf"), ("INCRBYFLOAT", "f", "1e5000"),
        ("INCRBYFLOAT", "f", "+1"), ("INCRBYFLOAT", "f", ".5"), ("INCRBYFLOAT", "f", "5."),
        ("INCRBYFLOAT", "f", "1e-5000"), ("INCRBYFLOAT", "h", "-0"), ("INCRBYFLOAT", "h", "-0.0"),
        ("INCRBYFLOAT", "i", "3"), ("INCRBYFLOAT", "i", "-3"), ("INCRBYFLOAT", "j", "1.23456789012345678"),
        ("INCRBYFLOAT", "l", "12345678901234567890"), ("INCRBYFLOAT", "m", "0.00000000000000000001"),
        ("INCRBYFLOAT", "o", "1.7976931348623157e308"), ("INCRBYFLOAT", "o", "1.7976931348623157e308"),
        ("SET", "s", "text"), ("INCRBYFLOAT", "s", "1"), ("SET", "s", "1.5 "), ("INCRBYFLOAT", "s", "1"),
        ("SET", "s", "10"), ("INCRBYFLOAT", "s", "1.5"), ("SET", "t", "1", "EX", "100"),
        ("INCRBYFLOAT", "t", "1"), ("TTL", "t"), ("INCRBYFLOAT", "f"), ("INCRBYFLOAT", "f", "1", "2"),
        ("INCRBY", "g", "1"),
    ],
    "lcs": [
        ("SET", "a", "ohmytext"), ("SET", "b", "mynewtext"), ("LCS", "a", "b"), ("LCS", "a", "b", "LEN"),
        ("LCS", "a", "b", "IDX"), ("LCS", "a", "b", "IDX", "MINMATCHLEN", "4"),
        ("LCS", "a", "b", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"), ("LCS", "a", "b", "IDX", "WITHMATCHLEN"),
        ("LCS", "a", "b", "LEN", "IDX"), ("LCS", "a", "b", "FOO"), ("LCS", "a", "b", "MINMATCHLEN"),
        ("LCS", "a", "b", "IDX", "MINMATCHLEN", "x"), ("LCS", "a", "b", "IDX", "MINMATCHLEN", "-3"),
        ("LCS", "a", "nokey"), ("LCS", "nokey", "nokey2", "IDX"), ("LCS", "a", "a", "IDX", "WITHMATCHLEN"),
        ("SET", "c", "rosettacode"), ("SET", "d", "raisethysword"), ("LCS", "c", "d"),
        ("LCS", "c", "d", "IDX", "WITHMATCHLEN"), ("LCS", "d", "c", "IDX", "WITHMATCHLEN"),
        ("SET", "e", "aaaa"), ("SET", "f", "aa"), ("LCS", "e", "f", "IDX", "WITHMATCHLEN"),
        ("LCS", "f", "e", "IDX"), ("SET", "g", "abcabcabc"), ("SET", "h", "cbacbacba"),
        ("LCS", "g", "h"), ("LCS", "g", "h", "IDX", "WITHMATCHLEN"), ("LCS", "h", "g", "IDX"),
        ("SET", "i", "xaybzc"), ("SET", "j", "abc"), ("LCS", "i", "j", "IDX", "MINMATCHLEN", "1"),
        ("SET", "long", "x" + "y" * 3000 + "abc" + "q" * 500), ("SET", "short", "xzab"),
        ("LCS", "long", "short", "IDX", "WITHMATCHLEN"), ("LCS", "short", "long", "IDX", "WITHMATCHLEN"),
        ("LCS", "long", "short"), ("LCS", "long", "long", "LEN"),
        ("LCS", "a"), ("LCS", "a", "b", "idx", "len"),
    ],
    "bits": [
        ("SETBIT", "b", "7", "1"), ("GET", "b"), ("SETBIT", "b", "7", "0"), ("SETBIT", "b", "0", "1"),
        ("SETBIT", "b", "-1", "1"), ("SETBIT", "b", "x", "1"), ("SETBIT", "b", "1", "2"),
        ("SETBIT", "b", "1", "-1"), ("SETBIT", "b", "1", "x"), ("SETBIT", "b", "536870912", "1"),
        ("SETBIT", "b", "4294967296", "1"), ("SETBIT", "b", MAX, "1"), ("SETBIT", "b", "23", "1"),
        ("GET", "b"), ("GETBIT", "b", "0"), ("GETBIT", "b", "1"), ("GETBIT", "b", "23"),
        ("GETBIT", "b", "100"), ("GETBIT", "b", "-1"), ("GETBIT", "nokey", "5"), ("GETBIT", "b", "x"),
        ("GETBIT", "b", "536870912"), ("SETBIT", "nokey2", "10", "0"), ("GET", "nokey2"),
        ("SET", "t", "a", "EX", "100"), ("SETBIT", "t", "20", "1"), ("TTL", "t"),
        ("SET", "s", "foobar"), ("BITCOUNT", "s"), ("BITCOUNT", "s", "0", "0"), ("BITCOUNT", "s", "1", "1"),
        ("BITCOUNT", "s", "1", "1", "BYTE"), ("BITCOUNT", "s", "5", "30", "BIT"), ("BITCOUNT", "s", "-2", "-1"),
        ("BITCOUNT", "s", "-1", "-2"), ("BITCOUNT", "s", "-100", "-200"), ("BITCOUNT", "s", "-200", "-100"),
        ("BITCOUNT", "s", "0", MAX), ("BITCOUNT", "s", MIN, "2"), ("BITCOUNT", "s", "0"),
        ("BITCOUNT", "s", "0", "1", "FOO"), ("BITCOUNT", "s", "0", "1", "BIT", "x"), ("BITCOUNT", "s", "a", "1"),
        ("BITCOUNT", "s", "-9", "-1", "bit"), ("BITCOUNT", "s", "47", "47", "BIT"), ("BITCOUNT", "s", "48", "100", "BIT"),
        ("BITCOUNT", "nokey"), ("BITCOUNT", "nokey", "0", "1"), ("BITCOUNT", "nokey", "0"),
        ("BITCOUNT", "nokey", "a", "b"), ("BITCOUNT", "nokey", "0", "1", "FOO"), ("SET", "e", ""),
        ("BITCOUNT", "e"), ("BITCOUNT", "e", "0", "-1"), ("BITCOUNT",),
    ],
    "bitpos": [
        ("SET", "p", b"\xff\xf0\x00"), ("BITPOS", "p", "0"), ("BITPOS", "p", "1"), ("BITPOS", "p", "1", "1"),
        ("BITPOS", "p", "0", "0", "0"), ("BITPOS", "p", "1", "2"), ("BITPOS", "p", "1", "2", "-1"),
        ("BITPOS", "p", "0", "2", "-1"), ("BITPOS", "p", "1", "7", "15", "BIT"), ("BITPOS", "p", "0", "7", "15", "BIT"),
        ("BITPOS", "p", "0", "0", "11", "BIT"), ("BITPOS", "p", "1", "12", "-1", "BIT"), ("BITPOS", "p", "2"),
        ("BITPOS", "p", "x"), ("BITPOS", "p", "-1"), ("BITPOS", "p", "1", "x"), ("BITPOS", "p", "1", "0", "x"),
        ("BITPOS", "p", "1", "0", "1", "FOO"), ("BITPOS", "p", "1", "0", "1", "BIT", "x"), ("BITPOS", "p", "1", "3", "1"),
        ("BITPOS", "p", "1", "-1", "-3"), ("BITPOS", "p", "1", "-100", "-200"), ("BITPOS", "p", "0", "0", MAX),
        ("BITPOS", "nokey", "1"), ("BITPOS", "nokey", "0"), ("BITPOS", "nokey", "1", "x"), ("BITPOS", "nokey", "2"),
        ("SET", "ones", b"\xff\xff"), ("BITPOS", "ones", "0"), ("BITPOS", "ones", "0", "0"), ("BITPOS", "ones", "0", "0", "-1"),
        ("BITPOS", "ones", "0", "0", "-1", "BIT"), ("BITPOS", "ones", "0", "3", "BIT"), ("SET", "zeros", b"\x00\x00"),
        ("BITPOS", "zeros", "1"), ("BITPOS", "zeros", "0"), ("BITPOS", "zeros", "0", "1"), ("SET", "e", ""),
        ("BITPOS", "e", "0"), ("BITPOS", "e", "1"), ("BITPOS", "e", "0", "0", "-1"), ("BITPOS", "p"),
    ],
    "copy-rename": [
        ("SET", "a", "1", "EX", "100"), ("SET", "b", "2"), ("COPY", "a", "a"), ("COPY", "a", "c", "DB", "0"),
        ("TTL", "c"), ("COPY", "a", "d", "DB", "1"), ("COPY", "a", "d", "DB", "x"), ("COPY", "a", "d", "DB", "-1"),
        ("COPY", "a", "d", "REPLACE", "DB"), ("COPY", "a", "d", "FOO"), ("COPY", "nokey", "d"),
        ("COPY", "a", "b"), ("GET", "b"), ("COPY", "a", "b", "REPLACE"), ("GET", "b"), ("TTL", "b"),
        ("COPY", "a", "b", "replace", "db", "0"), ("COPY", "a"), ("RENAME", "nokey", "x"), ("RENAME", "a", "a"),
        ("RENAMENX", "a", "a"), ("RENAMENX", "nokey", "a"), ("RENAME", "a", "z"), ("EXISTS", "a"), ("TTL", "z"),
        ("GET", "z"), ("RENAMENX", "z", "b"), ("RENAMENX", "z", "y"), ("GET", "y"), ("EXISTS", "z"),
        ("RENAME", "y", "b"), ("GET", "b"), ("TTL", "b"), ("RENAME", "b"), ("RENAMENX", "b", "c", "d"),
        ("TOUCH", "b", "c", "nokey", "b"), ("TOUCH",), ("FLUSHALL",), ("RANDOMKEY",),
        ("SET", "only", "1"), ("RANDOMKEY",), ("RANDOMKEY", "x"),
    ],
    "object": [
        ("SET", "i", "12345"), ("SET", "n", "-0"), ("SET", "big", "12345678901234567890"),
        ("SET", "neg", MIN), ("SET", "pos", MAX), ("SET", "lead", "012"), ("SET", "plus", "+1"),
        ("SET", "s44", "x" * 44), ("SET", "s45", "x" * 45), ("SET", "e", ""), ("SET", "sp", " 1"),
        *[("OBJECT", "ENCODING", key) for key in ("i", "n", "big", "neg", "pos", "lead", "plus", "s44", "s45", "e", "sp", "nokey")],
        ("INCR", "c"), ("OBJECT", "ENCODING", "c"), ("INCRBYFLOAT", "f", "1.5"), ("OBJECT", "ENCODING", "f"),
        ("OBJECT", "REFCOUNT", "s44"), ("OBJECT", "REFCOUNT", "i"), ("OBJECT", "REFCOUNT", "nokey"),
        ("OBJECT", "IDLETIME", "i"), ("OBJECT", "IDLETIME", "nokey"), ("OBJECT", "FREQ", "i"),
        ("OBJECT", "FREQ", "nokey"), ("OBJECT", "ENCODING"), ("OBJECT", "FOO"), ("OBJECT", "ENCODING", "a", "b"),
        ("OBJECT",), ("MEMORY", "USAGE", "nokey"), ("MEMORY", "USAGE", "i", "SAMPLES"),
        ("MEMORY", "USAGE", "i", "SAMPLES", "x"), ("MEMORY", "USAGE", "i", "FOO"), ("MEMORY", "FOO"),
        ("MEMORY", "USAGE"),
    ],
    "transactions": [
        ("MULTI",), ("SHUTDOWN",), ("WATCH", "a"), ("MULTI",), ("SET", "a", "1"), ("EXEC",), ("GET", "a"),
        ("MULTI",), ("WATCH", "x"), ("SET", "a", "2"), ("EXEC",), ("SAVE",), ("MULTI",), ("SAVE",), ("EXEC",),
        ("MULTI",), ("SHUTDOWN", "NOSAVE"),
        ("DISCARD",), ("WATCH",), ("WATCH", "a", "b"), ("SET", "a", "3"), ("MULTI",), ("GET", "a"), ("EXEC",),
        ("WATCH", "a"), ("MULTI",), ("GET", "a"), ("EXEC",), ("WATCH", "a"), ("UNWATCH",), ("SET", "a", "4"),
        ("MULTI",), ("GET", "a"), ("EXEC",), ("WATCH", "nokey"), ("SET", "nokey", "1"), ("MULTI",),
        ("PING",), ("EXEC",), ("WATCH", "nokey2"), ("MULTI",), ("SET", "nokey2", "x"), ("EXEC",),
        ("WATCH", "a"), ("DEL", "a"), ("MULTI",), ("EXEC",), ("SET", "a", "1"), ("WATCH", "a"),
        ("EXPIRE", "a", "100"), ("MULTI",), ("EXEC",), ("WATCH", "a"), ("SET", "a", "1", "NX"),
        ("MULTI",), ("EXEC",), ("WATCH", "a"), ("EXPIRE", "nokey3", "10"), ("GET", "a"), ("MULTI",),
        ("EXEC",), ("WATCH", "a"), ("FLUSHALL",), ("MULTI",), ("EXEC",), ("WATCH", "gone"), ("FLUSHALL",),
        ("MULTI",), ("EXEC",), ("SET", "a", "1"), ("WATCH", "a"), ("MULTI",), ("UNWATCH",), ("EXEC",),
        ("WATCH", "a"), ("MULTI",), ("DISCARD",), ("SET", "a", "2"), ("MULTI",), ("EXEC",),
        ("WATCH", "a"), ("SET", "a", "2"), ("MULTI",), ("NOSUCH",), ("EXEC",), ("UNWATCH", "x"),
        ("EXEC",), ("DISCARD",),
    ],
    "slowlog-config": [
        ("CONFIG", "SET", "slowlog-max-len", "-1"), ("CONFIG", "SET", "slowlog-max-len", "x"),
        ("CONFIG", "SET", "slowlog-log-slower-than", "-5"), ("CONFIG", "SET", "slowlog-log-slower-than", "1.5"),
        ("CONFIG", "GET", "slowlog-max-len"), ("CONFIG", "GET", "slowlog-log-slower-than"),
        ("CONFIG", "SET", "slowlog-max-len", "3"), ("CONFIG", "SET", "slowlog-log-slower-than", "-1"),
        ("SLOWLOG", "RESET"), ("SLOWLOG", "LEN"), ("SLOWLOG", "GET"), ("SLOWLOG", "GET", "-2"),
        ("SLOWLOG", "GET", "x"), ("SLOWLOG", "GET", "0"), ("SLOWLOG", "GET", "1", "2"), ("SLOWLOG", "FOO"),
        ("SLOWLOG", "LEN", "x"), ("SLOWLOG", "RESET", "x"), ("SLOWLOG",),
        ("CONFIG", "SET", "slowlog-max-len", "128"), ("CONFIG", "SET", "slowlog-log-slower-than", "10000"),
        ("CONFIG", "RESETSTAT"), ("CONFIG", "RESETSTAT", "x"),
    ],
}


def random_script(seed: int, length: int) -> list[tuple]:
    """A seeded random mix of string and keyspace commands over a few keys and edge values."""
    import random

    rng = random.Random(seed)
    keys = ["a", "b", "c", "n"]
    values = ["", "0", "1", "-1", "10", "3.5", "abc", "hello world", MAX, MIN, b"\xff\x00\x0f", "x" * 50, "007"]
    offsets = ["-1", "0", "1", "2", "3", "7", "8", "15", "17", "100", "-100", "-3", MAX, MIN, "x", "1.5"]
    times = [FAR, "4102444801", "1", "0", "-5", "x", "9223372036854776"]
    key, value, offset, at = (lambda: rng.choice(keys)), (lambda: rng.choice(values)), \
        (lambda: rng.choice(offsets)), (lambda: rng.choice(times))
    unit = lambda: rng.choice(["BYTE", "BIT", "bit", "WORD"])  # noqa: E731
    makers = [
        lambda: ("SET", key(), value()), lambda: ("GET", key()), lambda: ("APPEND", key(), value()),
        lambda: ("SETRANGE", key(), offset(), value()), lambda: ("GETRANGE", key(), offset(), offset()),
        lambda: ("SUBSTR", key(), offset(), offset()), lambda: ("SETBIT", key(), offset(), rng.choice("0112x")),
        lambda: ("GETBIT", key(), offset()), lambda: ("BITCOUNT", key()),
        lambda: ("BITCOUNT", key(), offset(), offset()), lambda: ("BITCOUNT", key(), offset(), offset(), unit()),
        lambda: ("BITPOS", key(), rng.choice("012")), lambda: ("BITPOS", key(), rng.choice("01"), offset()),
        lambda: ("BITPOS", key(), rng.choice("01"), offset(), offset()),
        lambda: ("BITPOS", key(), rng.choice("01"), offset(), offset(), unit()),
        lambda: ("INCR", key()), lambda: ("INCRBY", key(), offset()), lambda: ("DECRBY", key(), offset()),
        lambda: ("INCRBYFLOAT", key(), rng.choice(["0.1", "-2.5", "1e3", "abc", "3", "-0.1", "1.5e-3"])),
        lambda: ("GETSET", key(), value()), lambda: ("GETDEL", key()), lambda: ("MSET", key(), value(), key(), value()),
        lambda: ("MSETNX", key(), value(), key(), value()), lambda: ("MGET", key(), key(), key()),
        lambda: ("STRLEN", key()), lambda: ("LCS", key(), key()), lambda: ("LCS", key(), key(), "IDX", "WITHMATCHLEN"),
        lambda: ("LCS", key(), key(), "LEN"), lambda: ("COPY", key(), key()), lambda: ("COPY", key(), key(), "REPLACE"),
        lambda: ("RENAME", key(), key()), lambda: ("RENAMENX", key(), key()), lambda: ("EXISTS", key(), key()),
        lambda: ("DEL", key()), lambda: ("TOUCH", key(), key()),
        lambda: ("EXPIREAT", key(), at(), *rng.choice([(), ("NX",), ("XX",), ("GT",), ("LT",), ("NX", "GT")])),
        lambda: ("PEXPIREAT", key(), at() + "000"), lambda: ("EXPIRETIME", key()), lambda: ("PEXPIRETIME", key()),
        lambda: ("PERSIST", key()), lambda: ("GETEX", key(), rng.choice(["EXAT", "PXAT"]), at()),
        lambda: ("GETEX", key(), "PERSIST"), lambda: ("GETEX", key()), lambda: ("SETNX", key(), value()),
        lambda: ("SET", key(), value(), rng.choice(["NX", "XX", "GET", "KEEPTTL"])), lambda: ("TYPE", key()),
        # relative times only where they fail: a relative deadline differs by a millisecond or so
        lambda: ("SETEX", key(), rng.choice(["0", "-1", "x", MAX, "9223372036854776"]), value()),
        lambda: ("PSETEX", key(), rng.choice(["0", "x", MAX]), value()), lambda: ("DECR", key()),
        lambda: ("INCRBY", key(), rng.choice([MAX, MIN, "1", "-1"])), lambda: ("DECRBY", key(), rng.choice([MIN, MAX])),
        lambda: ("SET", key(), value(), rng.choice(["EXAT", "PXAT"]), at()),
        lambda: ("SET", key(), value(), "EX", rng.choice(["0", "-5", "x", MAX, "9223372036854776"])),
        lambda: ("SET", key(), value(), "PX", rng.choice(["0", "-5", "x", MAX])),
        lambda: ("SET", key(), value(), "GET", rng.choice(["NX", "XX"])), lambda: ("DEL", key(), key(), key()),
        lambda: ("EXISTS", key(), key(), key(), key()), lambda: ("UNLINK", key()),
    ]
    return [rng.choice(makers)() for _ in range(length)]


for _seed in range(4):
    SCRIPTS[f"random-{_seed}"] = random_script(_seed, 600)


def random_transactions(seed: int, length: int) -> list[tuple[int, tuple]]:
    """(connection 0 or 1, argv): WATCH/MULTI/EXEC/DISCARD/UNWATCH between writes and reads
    of a few keys on two connections, so that watched keys change on either side."""
    import random

    rng = random.Random(seed)
    keys = ["a", "b", "c"]
    key = lambda: rng.choice(keys)  # noqa: E731
    makers = [
        lambda: ("WATCH", key()), lambda: ("WATCH", key(), key()), lambda: ("UNWATCH",), lambda: ("MULTI",),
        lambda: ("EXEC",), lambda: ("EXEC",), lambda: ("DISCARD",), lambda: ("SET", key(), rng.choice("xy")),
        lambda: ("SET", key(), "x", "NX"), lambda: ("SET", key(), "x", "XX"), lambda: ("GET", key()),
        lambda: ("DEL", key()), lambda: ("INCR", key()), lambda: ("EXPIRE", key(), "1000"), lambda: ("PERSIST", key()),
        lambda: ("APPEND", key(), "z"), lambda: ("RENAME", key(), key()), lambda: ("COPY", key(), key(), "REPLACE"),
        lambda: ("GETEX", key(), "PERSIST"), lambda: ("MSETNX", key(), "1", key(), "2"), lambda: ("EXISTS", key()),
        lambda: ("SETRANGE", key(), "1", ""), lambda: ("FLUSHALL",), lambda: ("SAVE",),
        lambda: ("GETSET", key(), "g"), lambda: ("SETBIT", key(), "3", rng.choice("01")),
    ]
    return [(rng.randrange(2), rng.choice(makers)()) for _ in range(length)]

NEW_COMMANDS = ["GETEX", "GETSET", "GETRANGE", "SUBSTR", "SETRANGE", "MSETNX", "INCRBYFLOAT", "LCS", "SETBIT",
                "GETBIT", "BITCOUNT", "BITPOS", "EXPIRETIME", "PEXPIRETIME", "COPY", "RENAME", "RENAMENX",
                "RANDOMKEY", "TOUCH", "WATCH", "UNWATCH", "SAVE"]
# Every new command with too few and with too many arguments: Redis's arity errors.
SCRIPTS["arity"] = [(name, *["k"] * count) for name in NEW_COMMANDS for count in (0, 1, 2, 5)
                    if not (name == "SAVE" and count == 0)] + [
    ("OBJECT", "ENCODING"), ("OBJECT", "REFCOUNT", "a", "b"), ("OBJECT", "IDLETIME"), ("OBJECT", "FREQ", "a", "b"),
    ("MEMORY", "USAGE"), ("SLOWLOG", "LEN", "x"), ("SLOWLOG", "RESET", "x"), ("CONFIG", "RESETSTAT", "x"),
    ("OBJECT", "NOPE"), ("MEMORY", "NOPE"), ("SLOWLOG", "NOPE"),
]

# Redis's own suite (tests/unit/type/string, incr, keyspace, introspection-2; see
# bench/redis_suite.py): the families it found ARCA answering differently, one script each.
SCRIPTS["command-getkeys"] = [
    ("COMMAND", "GETKEYS", "GET", "k"), ("COMMAND", "GETKEYS", "get", "k"),
    ("COMMAND", "GETKEYS", "MEMORY", "USAGE", "k"), ("COMMAND", "GETKEYS", "LCS", "a", "b"),
    ("COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2"), ("COMMAND", "GETKEYS", "EXISTS", "a", "b", "c"),
    ("COMMAND", "GETKEYS", "SET", "k", "v", "EX", "10"), ("COMMAND", "GETKEYS", "OBJECT", "ENCODING", "k"),
    ("COMMAND", "GETKEYS", "PING", "x"), ("COMMAND", "GETKEYS", "NOSUCH", "x"), ("COMMAND", "GETKEYS", "GET", "a", "b"),
    ("COMMAND", "GETKEYS", "MSET", "a"), ("COMMAND", "GETKEYS", "OBJECT", "NOPE", "k"),
    ("COMMAND", "GETKEYS", "CONFIG", "GET", "x"), ("COMMAND", "GETKEYS", "GET"), ("COMMAND", "GETKEYS"),
    ("COMMAND", "GETKEYSANDFLAGS", "GET", "k"), ("COMMAND", "GETKEYSANDFLAGS", "PING", "x"),
    ("COMMAND", "INFO", "get|key"), ("COMMAND", "INFO", "config|get|key"), ("COMMAND", "INFO", "nosuch"),
    ("COMMAND", "LIST", "FILTERBY", "MODULE", "nosuch"), ("COMMAND", "LIST", "FILTERBY", "ACLCAT", "nosuch"),
    ("COMMAND", "LIST", "FILTERBY", "PATTERN", "get"), ("COMMAND", "LIST", "FILTERBY", "PATTERN", "nosuch*"),
    ("COMMAND", "LIST", "FILTERBY", "PATTERN", "incrbyf*"), ("COMMAND", "LIST", "bad"),
    ("COMMAND", "LIST", "FILTERBY", "bad"), ("COMMAND", "LIST", "FILTERBY", "bad", "x"),
    ("COMMAND", "LIST", "FILTERBY", "PATTERN", "a", "b"),
]
SCRIPTS["object-encoding-transitions"] = [
    ("SET", "a", "1234"), ("OBJECT", "ENCODING", "a"), ("SETRANGE", "a", "0", "2"), ("OBJECT", "ENCODING", "a"),
    ("GET", "a"), ("SET", "a", "1234"), ("SETRANGE", "a", "0", ""), ("OBJECT", "ENCODING", "a"),
    ("SETRANGE", "a", "5", "2"), ("OBJECT", "ENCODING", "a"), ("INCR", "n"), ("OBJECT", "ENCODING", "n"),
    ("DECR", "n"), ("OBJECT", "ENCODING", "n"), ("INCRBY", "n", "100"), ("OBJECT", "ENCODING", "n"),
    ("DECRBY", "n", "7"), ("OBJECT", "ENCODING", "n"), ("APPEND", "n", "5"), ("OBJECT", "ENCODING", "n"),
    ("INCR", "n"), ("OBJECT", "ENCODING", "n"), ("SET", "s", "x"), ("APPEND", "s", "y"), ("OBJECT", "ENCODING", "s"),
    ("APPEND", "new", "12"), ("OBJECT", "ENCODING", "new"), ("APPEND", "new2", "hello"),
    ("OBJECT", "ENCODING", "new2"), ("INCRBYFLOAT", "f", "1"), ("OBJECT", "ENCODING", "f"),
    ("INCRBYFLOAT", "f", "1.5"), ("OBJECT", "ENCODING", "f"), ("SETBIT", "b", "1", "1"), ("OBJECT", "ENCODING", "b"),
    ("COPY", "s", "c"), ("OBJECT", "ENCODING", "c"), ("RENAME", "c", "d"), ("OBJECT", "ENCODING", "d"),
    ("EXPIRE", "d", "100"), ("OBJECT", "ENCODING", "d"), ("PERSIST", "d"), ("OBJECT", "ENCODING", "d"),
    ("SET", "d", "12"), ("OBJECT", "ENCODING", "d"), ("SETRANGE", "r", "0", "5"), ("OBJECT", "ENCODING", "r"),
    ("SET", "big", "x" * 44), ("OBJECT", "ENCODING", "big"), ("APPEND", "big", "y"), ("OBJECT", "ENCODING", "big"),
    ("SET", "big", "x" * 45), ("OBJECT", "ENCODING", "big"), ("GETSET", "b", "7"), ("OBJECT", "ENCODING", "b"),
    ("MSET", "a", "5", "s", "t"), ("OBJECT", "ENCODING", "a"), ("OBJECT", "ENCODING", "s"),
    ("SET", "i", "12345678901234567890"), ("OBJECT", "ENCODING", "i"), ("SET", "i", "-0"), ("OBJECT", "ENCODING", "i"),
]
SCRIPTS["randomkey"] = [
    ("RANDOMKEY",), ("SET", "a", "1", "EX", "100"), ("RANDOMKEY",), ("SET", "b", "1", "PXAT", "1"), ("RANDOMKEY",),
    ("EXISTS", "b"), ("PEXPIREAT", "a", "1"), ("RANDOMKEY",), ("DBSIZE",), ("SET", "c", "1"), ("EXPIRE", "c", "100"),
    ("RANDOMKEY",), ("FLUSHALL",), ("RANDOMKEY",),
]
SCRIPTS["glob-nesting"] = [
    ("SET", "a" * 95, "1"), ("KEYS", "a*" * 35 + "b"), ("KEYS", "a*" * 35), ("FLUSHALL",),
    ("SET", "a" * 1001, "1"), ("KEYS", "a*" * 1001), ("KEYS", "*a" * 1001), ("KEYS", "*" * 1001 + "a"),
    ("KEYS", "a*" * 999 + "a"), ("FLUSHALL",), ("SET", "a" * 50000, "1"), ("KEYS", "*?" * 50000), ("FLUSHALL",),
    ("SET", "dlskeriewrioeuwqoirueioqwrueoqwrueqw", "test"), ("KEYS", "*"), ("KEYS", "*"),
    ("SET", "k" * 20000, "v"), ("KEYS", "k*k"), ("KEYS", "*" * 3 + "k" * 20000), ("DEL", "k" * 20000), ("KEYS", "*"),
]
