"""The RESP decoder (fast and slow paths, inline quoting, every limit) and the reply encoder."""

from __future__ import annotations

import pytest

from arca.protocol import Decoder, ErrorReply, Limits, Status, encode, split_inline

GET_K = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"


def feed_all(decoder: Decoder, *chunks: bytes) -> list[list[bytes]]:
    out = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


def test_pipelined_commands_in_one_read():
    assert Decoder().feed(GET_K * 3 + b"*1\r\n$4\r\nPING\r\n") == [[b"GET", b"k"]] * 3 + [[b"PING"]]


def test_every_split_point_gives_the_same_commands():
    stream = GET_K + b"*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$12\r\nhello\r\nworld\r\n" + b"PING\r\n" + GET_K
    expected = Decoder().feed(stream)
    assert expected == [[b"GET", b"k"], [b"SET", b"key:1", b"hello\r\nworld"], [b"PING"], [b"GET", b"k"]]
    for cut in range(1, len(stream)):
        assert feed_all(Decoder(), stream[:cut], stream[cut:]) == expected, cut
    decoder = Decoder()
    assert feed_all(decoder, *(stream[i : i + 1] for i in range(len(stream)))) == expected
    assert decoder.buffered == 0 and decoder.error is None


def test_empty_and_null_multibulk_are_skipped():
    assert Decoder().feed(b"*0\r\n" + GET_K + b"*-1\r\n" + GET_K) == [[b"GET", b"k"]] * 2


def test_large_values_cross_reads():
    value = bytes(range(256)) * 4096  # 1 MiB, every byte value
    stream = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n" % (len(value), value)
    decoder = Decoder()
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    assert feed_all(decoder, *chunks) == [[b"SET", b"k", value]]


@pytest.mark.parametrize(
    "line, args",
    [
        (b"PING", [b"PING"]),
        (b"  set  a   b  ", [b"set", b"a", b"b"]),
        (b'set k "hello world"', [b"set", b"k", b"hello world"]),
        (b'set k "a\\x41\\n\\t\\"q\\""', [b"set", b"k", b'aA\n\t"q"']),
        (b"set k 'it\\'s'", [b"set", b"k", b"it's"]),
        (b"set k 'no \\n escape'", [b"set", b"k", b"no \\n escape"]),
        (b'set k ""', [b"set", b"k", b""]),
        (b'a"b c" d', [b"ab c", b"d"]),
        (b"", []),
    ],
)
def test_inline_quoting(line, args):
    assert split_inline(line) == args


def test_inline_commands_and_blank_lines():
    assert Decoder().feed(b"PING\r\n\r\nECHO 'x y'\nGET k\r\n") == [[b"PING"], [b"ECHO", b"x y"], [b"GET", b"k"]]


@pytest.mark.parametrize(
    "stream, error",
    [
        (b'SET k "unterminated\r\n', "unbalanced quotes in request"),
        (b'SET k "closed"x\r\n', "unbalanced quotes in request"),
        (b"SET k 'closed'x\r\n", "unbalanced quotes in request"),
        (b"*1\r\n+PING\r\n", "expected '$', got '+'"),
        (b"*1\r\n:1\r\n", "expected '$', got ':'"),
        (b"*2\r\n$3\r\nGET\r\n*1\r\n$1\r\nk\r\n", "expected '$', got '*'"),
        (b"*x\r\n", "invalid multibulk length"),
        (b"*01\r\n$4\r\nPING\r\n", "invalid multibulk length"),
        (b"*99999999999999999999999\r\n", "invalid multibulk length"),
        (b"*1\r\n$-1\r\n", "invalid bulk length"),
        (b"*1\r\n$x\r\n", "invalid bulk length"),
        (b"*1\r\n$04\r\nPING\r\n", "invalid bulk length"),
        (b"*1\r\n$99999999999999999999\r\n", "invalid bulk length"),
    ],
)
def test_malformed_input_errors(stream, error):
    decoder = Decoder()
    assert decoder.feed(stream) == []
    assert decoder.error == error


def test_commands_before_an_error_are_returned():
    decoder = Decoder()
    assert decoder.feed(GET_K + b"*1\r\n$x\r\n" + GET_K) == [[b"GET", b"k"]]
    assert decoder.error == "invalid bulk length"
    assert decoder.feed(GET_K) == []  # nothing more is decoded on a broken stream


def test_limits():
    limits = Limits(max_bulk_len=100, max_multibulk_len=3, max_inline_len=50, max_query_buffer=1000)
    decoder = Decoder(limits)
    assert decoder.feed(b"*1\r\n$100\r\n" + b"x" * 100 + b"\r\n") == [[b"x" * 100]]
    decoder.feed(b"*1\r\n$101\r\n")
    assert decoder.error == "invalid bulk length"
    decoder = Decoder(limits)
    decoder.feed(b"*4\r\n")
    assert decoder.error == "invalid multibulk length"
    decoder = Decoder(limits)
    decoder.feed(b"a b c d\r\n")
    assert decoder.error == "invalid multibulk length"
    decoder = Decoder(limits)
    decoder.feed(b"PING " + b"x" * 60)
    assert decoder.error == "too big inline request"
    decoder = Decoder(limits)
    decoder.feed(b"*1" + b"1" * 60)
    assert decoder.error == "too big mbulk count string"
    decoder = Decoder(limits)
    decoder.feed(b"*1\r\n$" + b"1" * 60)
    assert decoder.error == "too big bulk count string"


def test_query_buffer_limit_counts_finished_arguments_too():
    limits = Limits(max_bulk_len=400, max_multibulk_len=100, max_query_buffer=1000)
    decoder = Decoder(limits)
    decoder.feed(b"*9\r\n")
    for _ in range(2):
        decoder.feed(b"$400\r\n" + b"y" * 400 + b"\r\n")
    assert decoder.error is None
    decoder.feed(b"$400\r\n" + b"y" * 400 + b"\r\n")
    assert decoder.error == "client query buffer limit exceeded"


def test_buffered_memory_stays_bounded_under_a_slow_huge_bulk():
    limits = Limits(max_bulk_len=1 << 20, max_query_buffer=2 << 20)
    decoder = Decoder(limits)
    decoder.feed(b"*1\r\n$%d\r\n" % (1 << 20))
    for _ in range(15):
        decoder.feed(b"z" * 65536)
    assert decoder.error is None and decoder.buffered <= (1 << 20) + 64
    assert decoder.feed(b"z" * 65536 + b"\r\n") == [[b"z" * (1 << 20)]]
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    "value, resp2, resp3",
    [
        (b"abc", b"$3\r\nabc\r\n", b"$3\r\nabc\r\n"),
        (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
        (Status("OK"), b"+OK\r\n", b"+OK\r\n"),
        (ErrorReply("ERR bad\r\nthing"), b"-ERR bad  thing\r\n", b"-ERR bad  thing\r\n"),
        (None, b"$-1\r\n", b"_\r\n"),
        (0, b":0\r\n", b":0\r\n"),
        (-5, b":-5\r\n", b":-5\r\n"),
        (2**62, b":%d\r\n" % 2**62, b":%d\r\n" % 2**62),
        (True, b":1\r\n", b"#t\r\n"),
        (False, b":0\r\n", b"#f\r\n"),
        (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
        (2.0, b"$1\r\n2\r\n", b",2\r\n"),
        ([b"a", None, 1], b"*3\r\n$1\r\na\r\n$-1\r\n:1\r\n", b"*3\r\n$1\r\na\r\n_\r\n:1\r\n"),
        ((), b"*0\r\n", b"*0\r\n"),
        ({b"k": [1]}, b"*2\r\n$1\r\nk\r\n*1\r\n:1\r\n", b"%1\r\n$1\r\nk\r\n*1\r\n:1\r\n"),
    ],
)
def test_encoding(value, resp2, resp3):
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3


def test_unencodable_values_are_a_bug_not_garbage():
    with pytest.raises(TypeError):
        encode(object())
