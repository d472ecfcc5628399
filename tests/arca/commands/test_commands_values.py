"""GETEX GETSET MSETNX INCRBYFLOAT GETRANGE SUBSTR SETRANGE LCS through dispatch over a real archive."""

from __future__ import annotations

import time

import pytest

from arca.commands.values import format_long_double, parse_long_double
from arca.protocol import ErrorReply, Status
from arca_harness import run

OK = Status("OK")
NOT_INT = ErrorReply("ERR value is not an integer or out of range")
NOT_FLOAT = ErrorReply("ERR value is not a valid float")
SYNTAX = ErrorReply("ERR syntax error")


def _deadline(ctx, key):
    entry = ctx.archive.get_entry(key.encode())
    return None if entry is None else entry.expire_at_ms


def test_getex_sets_and_removes_ttls(ctx):
    assert run(ctx, "GETEX", "nokey", "EX", "0") is None  # a missing key answers before the time is read
    run(ctx, "SET", "k", "v")
    assert run(ctx, "GETEX", "k") == b"v" and _deadline(ctx, "k") is None
    assert run(ctx, "GETEX", "k", "EX", "100") == b"v"
    assert 99 <= run(ctx, "TTL", "k") <= 100
    assert run(ctx, "GETEX", "k", "PX", "5000", "PX", "200000") == b"v"  # the last one counts
    assert 199 <= run(ctx, "TTL", "k") <= 200
    assert run(ctx, "GETEX", "k", "PERSIST") == b"v" and run(ctx, "TTL", "k") == -1
    assert run(ctx, "GETEX", "k", "EXAT", "4102444800") == b"v"
    assert run(ctx, "EXPIRETIME", "k") == 4102444800
    assert run(ctx, "GETEX", "k", "PXAT", "1") == b"v"  # a time in the past deletes
    assert run(ctx, "EXISTS", "k") == 0


@pytest.mark.parametrize("argv, error", [
    (("GETEX", "k", "EX", "0"), "ERR invalid expire time in 'getex' command"),
    (("GETEX", "k", "EX", "-5"), "ERR invalid expire time in 'getex' command"),
    (("GETEX", "k", "EX", "9223372036854776"), "ERR invalid expire time in 'getex' command"),
    (("GETEX", "k", "PX", "9223372036854775807"), "ERR invalid expire time in 'getex' command"),
    (("GETEX", "k", "EX", "ten"), NOT_INT),
    (("GETEX", "k", "EX"), SYNTAX),
    (("GETEX", "k", "EX", "1", "PX", "1"), SYNTAX),
    (("GETEX", "k", "PERSIST", "EX", "1"), SYNTAX),
    (("GETEX", "k", "KEEPTTL"), SYNTAX),
])
def test_getex_errors(ctx, argv, error):
    run(ctx, "SET", "k", "v", "EX", "100")
    assert run(ctx, *argv) == ErrorReply(error)
    assert run(ctx, "GET", "k") == b"v" and run(ctx, "TTL", "k") > 0  # nothing changed


def test_getset_returns_the_old_value_and_drops_the_ttl(ctx):
    assert run(ctx, "GETSET", "k", "a") is None
    run(ctx, "EXPIRE", "k", "100")
    assert run(ctx, "GETSET", "k", "b") == b"a"
    assert run(ctx, "GET", "k") == b"b" and run(ctx, "TTL", "k") == -1
    assert run(ctx, "GETSET", "k") == ErrorReply("ERR wrong number of arguments for 'getset' command")


def test_msetnx_is_all_or_nothing(ctx):
    assert run(ctx, "MSETNX", "a", "1", "b", "2") == 1
    assert run(ctx, "MSETNX", "c", "3", "a", "9") == 0
    assert run(ctx, "EXISTS", "c") == 0 and run(ctx, "GET", "a") == b"1"
    assert run(ctx, "MSETNX", "d", "1", "d", "2") == 1 and run(ctx, "GET", "d") == b"2"
    assert run(ctx, "MSETNX", "x", "1", "y") == ErrorReply("ERR wrong number of arguments for 'msetnx' command")


def test_msetnx_over_the_budget_sets_nothing(ctx):
    huge = b"x" * (9 << 20)  # the fixture's L1 budget is 8 MiB
    assert run(ctx, "MSETNX", "a", "1", "b", huge) == ErrorReply(
        "OOM command not allowed when used memory > 'maxmemory'.")
    assert run(ctx, "EXISTS", "a", "b") == 0


@pytest.mark.parametrize("start, increments, result", [
    (None, ["10.5"], b"10.5"),
    (None, ["0.1", "0.2"], b"0.3"),  # long double arithmetic, as Redis: not 0.30000000000000004
    ("10", ["1.5"], b"11.5"),
    (None, ["5.0e3"], b"5000"),
    (None, ["2.0e-3"], b"0.002"),
    (None, ["3", "-3"], b"0"),
    (None, ["-0.0"], b"0"),
    (None, ["1.23456789012345678"], b"1.23456789012345678"),
    (None, ["12345678901234567890"], b"12345678901234567890"),
    (None, [".5"], b"0.5"),
    (None, ["+1"], b"1"),
])
def test_incrbyfloat_results(ctx, start, increments, result):
    if start is not None:
        run(ctx, "SET", "f", start)
    for increment in increments:
        reply = run(ctx, "INCRBYFLOAT", "f", increment)
    assert reply == result and run(ctx, "GET", "f") == result


@pytest.mark.parametrize("stored, increment, error", [
    (None, "abc", NOT_FLOAT), (None, "", NOT_FLOAT), (None, " 1", NOT_FLOAT), (None, "1 ", NOT_FLOAT),
    (None, "nan", NOT_FLOAT), (None, "1e5000", NOT_FLOAT), (None, "1e-5000", NOT_FLOAT),
    ("text", "1", NOT_FLOAT), ("1.5 ", "1", NOT_FLOAT),
    (None, "inf", ErrorReply("ERR increment would produce NaN or Infinity")),
    ("1.5", "1e4933", NOT_FLOAT),
])
def test_incrbyfloat_errors(ctx, stored, increment, error):
    if stored is not None:
        run(ctx, "SET", "f", stored)
    assert run(ctx, "INCRBYFLOAT", "f", increment) == error
    assert run(ctx, "GET", "f") == (None if stored is None else stored.encode())


def test_incrbyfloat_keeps_the_ttl_of_the_key(ctx):
    run(ctx, "SET", "f", "1", "EX", "100")
    assert run(ctx, "INCRBYFLOAT", "f", "0.5") == b"1.5"
    assert 99 <= run(ctx, "TTL", "f") <= 100


def test_long_double_helpers_round_trip():
    assert format_long_double(parse_long_double(b"0.1") * 3) == b"0.3"
    assert format_long_double(parse_long_double(b"-1.5")) == b"-1.5"
    assert format_long_double(parse_long_double(b"0x10")) == b"16"


def test_getrange_and_substr_offsets(ctx):
    run(ctx, "SET", "k", "hello")
    cases = {("0", "-1"): b"hello", ("-3", "-1"): b"llo", ("1", "100"): b"ello", ("3", "1"): b"",
             ("-100", "-200"): b"", ("-1", "-5"): b"", ("-200", "-100"): b"h", ("4", "4"): b"o",
             ("5", "10"): b"", ("-9223372036854775808", "2"): b"hel", ("0", "9223372036854775807"): b"hello"}
    for (start, end), expected in cases.items():
        assert run(ctx, "GETRANGE", "k", start, end) == expected, (start, end)
        assert run(ctx, "SUBSTR", "k", start, end) == expected, (start, end)
    assert run(ctx, "GETRANGE", "nokey", "0", "-1") == b""
    assert run(ctx, "GETRANGE", "k", "a", "1") == NOT_INT
    assert run(ctx, "GETRANGE", "k", "0") == ErrorReply("ERR wrong number of arguments for 'getrange' command")


def test_setrange_pads_overwrites_and_keeps_the_ttl(ctx):
    assert run(ctx, "SETRANGE", "k", "3", "ab") == 5
    assert run(ctx, "GET", "k") == b"\x00\x00\x00ab"
    run(ctx, "SET", "t", "hello", "EX", "100")
    assert run(ctx, "SETRANGE", "t", "1", "EL") == 5
    assert run(ctx, "GET", "t") == b"hELlo" and run(ctx, "TTL", "t") > 0
    assert run(ctx, "SETRANGE", "t", "7", "!") == 8 and run(ctx, "GET", "t") == b"hELlo\x00\x00!"
    assert run(ctx, "SETRANGE", "t", "0", "") == 8
    assert run(ctx, "SETRANGE", "nokey", "100", "") == 0 and run(ctx, "EXISTS", "nokey") == 0


def test_setrange_limits(ctx):
    limit = ctx.server.options.limits.max_bulk_len
    assert run(ctx, "SETRANGE", "k", "-1", "x") == ErrorReply("ERR offset is out of range")
    assert run(ctx, "SETRANGE", "k", str(limit), "x") == ErrorReply(
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    assert run(ctx, "SETRANGE", "k", "9223372036854775807", "x") == ErrorReply(
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    # within proto-max-bulk-len but over the L1 budget (8 MiB in this fixture): -OOM, nothing set
    assert run(ctx, "SETRANGE", "k", str(9 << 20), "x") == ErrorReply(
        "OOM command not allowed when used memory > 'maxmemory'.")
    assert run(ctx, "EXISTS", "k") == 0


def test_lcs_string_length_and_ranges(ctx):
    run(ctx, "MSET", "a", "ohmytext", "b", "mynewtext")
    assert run(ctx, "LCS", "a", "b") == b"mytext"
    assert run(ctx, "LCS", "a", "b", "LEN") == 6
    assert run(ctx, "LCS", "a", "b", "IDX") == {b"matches": [[[4, 7], [5, 8]], [[2, 3], [0, 1]]], b"len": 6}
    assert run(ctx, "LCS", "a", "b", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN") == {
        b"matches": [[[4, 7], [5, 8], 4]], b"len": 6}
    assert run(ctx, "LCS", "a", "nokey") == b""
    assert run(ctx, "LCS", "a", "b", "LEN", "IDX") == ErrorReply(
        "ERR If you want both the length and indexes, please just use IDX.")
    assert run(ctx, "LCS", "a", "b", "MINMATCHLEN") == SYNTAX
    assert run(ctx, "LCS", "a", "b", "IDX", "MINMATCHLEN", "x") == NOT_INT


def test_lcs_of_long_values_is_bounded(ctx):
    run(ctx, "SET", "x", b"ab" * 1500)
    run(ctx, "SET", "y", b"ba" * 1500)
    started = time.perf_counter()
    assert run(ctx, "LCS", "x", "y", "LEN") == 2999
    assert len(run(ctx, "LCS", "x", "y")) == 2999
    assert time.perf_counter() - started < 5
    run(ctx, "SET", "big", b"a" * 5000)
    assert run(ctx, "LCS", "big", "big") == ErrorReply(
        "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")


def _plain_lcs_table(a: bytes, b: bytes) -> list[list[int]]:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
    return table


def test_lcs_table_and_walk_against_plain_versions():
    import random

    from arca.commands.ranges import lcs_table, walk_back

    rng = random.Random(7)
    for _ in range(300):
        alphabet = rng.choice([b"ab", b"abc", b"wxyz", bytes(range(256))])
        a = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        b = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.4:  # long runs in one direction: the walk skips them
            a, b = (a + b"q" * rng.randint(1, 200), b) if rng.random() < 0.5 else (a, b"q" * rng.randint(1, 200) + b)
        table = lcs_table(a, b)
        assert table.tolist() == _plain_lcs_table(a, b)
        one_by_one = walk_back(a, b, table, 0, skip_after=1 << 30)
        assert walk_back(a, b, table, 0, skip_after=rng.choice([1, 2, 16])) == one_by_one
        assert len(one_by_one[0]) == table[len(a), len(b)]


def test_lcs_of_a_long_value_and_a_short_one_is_quick(ctx):
    run(ctx, "SET", "long", b"x" + b"y" * 2_000_000)
    run(ctx, "SET", "short", b"xz")
    started = time.perf_counter()
    assert run(ctx, "LCS", "long", "short", "IDX") == {b"matches": [[[0, 0], [0, 0]]], b"len": 1}
    assert run(ctx, "LCS", "short", "long") == b"x"
    assert time.perf_counter() - started < 5


def test_append_past_proto_max_bulk_len_is_refused(ctx):
    from dataclasses import replace

    from arca.protocol import Limits
    from arca.state import ServerState

    small = replace(ctx.server.options, limits=Limits(max_bulk_len=10, max_query_buffer=100))
    tight = type(ctx)(ctx.archive, ctx.client, ServerState.from_options(small))
    run(tight, "SET", "k", "12345")
    assert run(tight, "APPEND", "k", "67890") == 10
    assert run(tight, "APPEND", "k", "x") == ErrorReply("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    assert run(tight, "SETRANGE", "k", "10", "x") == ErrorReply("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    assert run(tight, "SETBIT", "k", "80", "1") == ErrorReply("ERR bit offset is not an integer or out of range")
    assert run(tight, "GET", "k") == b"1234567890"
