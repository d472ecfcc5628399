"""The live server's plain path (GET, SET, MGET and PING answered by the L1 table straight
from the read buffer) mixed with everything else: generated pipelines of GET, SET and other commands,
split at generated points, answered exactly as a dict model says, in both durability
modes; big replies that cut a batch short; RESP3 nulls; MULTI and AUTH turning it off."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arca_harness import start_server

KEYS = st.sampled_from([b"a", b"b", b"k:1", b"\r\n", b"", b"\xff\x00"])
VALUES = st.binary(max_size=24)
NAMES = {"get": st.sampled_from([b"GET", b"get", b"Get"]), "set": st.sampled_from([b"SET", b"set", b"sEt"]),
         "mget": st.sampled_from([b"MGET", b"mget"]), "ping": st.sampled_from([b"PING", b"ping"])}
OPS = st.one_of(
    st.tuples(st.just("get"), NAMES["get"], KEYS),
    st.tuples(st.just("mget"), NAMES["mget"], st.lists(KEYS, min_size=1, max_size=5)),
    st.tuples(st.just("ping"), NAMES["ping"]),
    st.tuples(st.just("ping_message"), st.just(b"PING"), VALUES),
    st.tuples(st.just("inline_ping"), st.sampled_from([b"PING\r\n", b"ping\n"])),
    st.tuples(st.just("incrby"), st.sampled_from([b"INCRBY", b"decrby"]), KEYS, st.sampled_from([b"1", b"-7", b"x", b"007"])),
    st.tuples(st.just("incr"), st.sampled_from([b"INCR", b"decr"]), KEYS),
    st.tuples(st.just("setnum"), st.just(b"SET"), KEYS, st.sampled_from([b"5", b"-3", b"9223372036854775807"])),
    st.tuples(st.just("mset"), st.just(b"MSET"), st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3)),
    st.tuples(st.just("set"), NAMES["set"], KEYS, VALUES),
    st.tuples(st.just("del"), st.just(b"DEL"), KEYS),
    st.tuples(st.just("append"), st.just(b"APPEND"), KEYS, VALUES),
    st.tuples(st.just("exists"), st.just(b"EXISTS"), KEYS),
    st.tuples(st.just("inline_get"), KEYS.filter(lambda k: k.isalnum() or k == b"k:1")),
)


def multibulk(argv: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)


def bulk(value: bytes | None) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%b\r\n" % (len(value), value)


def request_and_replies(ops: list[tuple], model: dict[bytes, bytes]) -> tuple[bytes, bytes]:
    """The bytes to send and the replies a Redis-compatible server owes, from a dict model."""
    request, replies = [], []
    for op in ops:
        kind = op[0]
        if kind == "get":
            request.append(multibulk([op[1], op[2]]))
            replies.append(bulk(model.get(op[2])))
        elif kind == "set":
            request.append(multibulk([op[1], op[2], op[3]]))
            model[op[2]] = op[3]
            replies.append(b"+OK\r\n")
        elif kind == "del":
            request.append(multibulk([op[1], op[2]]))
            replies.append(b":%d\r\n" % (model.pop(op[2], None) is not None))
        elif kind == "append":
            request.append(multibulk([op[1], op[2], op[3]]))
            model[op[2]] = model.get(op[2], b"") + op[3]
            replies.append(b":%d\r\n" % len(model[op[2]]))
        elif kind == "exists":
            request.append(multibulk([op[1], op[2]]))
            replies.append(b":%d\r\n" % (op[2] in model))
        elif kind == "mget":
            request.append(multibulk([op[1], *op[2]]))
            replies.append(b"*%d\r\n" % len(op[2]) + b"".join(bulk(model.get(key)) for key in op[2]))
        elif kind == "ping":
            request.append(multibulk([op[1]]))
            replies.append(b"+PONG\r\n")
        elif kind in ("incr", "incrby"):
            request.append(multibulk(list(op[1:])))
            replies.append(_add(model, op))
        elif kind == "setnum":
            request.append(multibulk([op[1], op[2], op[3]]))
            model[op[2]] = op[3]
            replies.append(b"+OK\r\n")
        elif kind == "mset":
            request.append(multibulk([op[1], *[x for pair in op[2] for x in pair]]))
            model.update(op[2])
            replies.append(b"+OK\r\n")
        elif kind == "inline_ping":
            request.append(op[1])
            replies.append(b"+PONG\r\n")
        elif kind == "ping_message":
            request.append(multibulk([op[1], op[2]]))
            replies.append(bulk(op[2]))
        else:  # an inline GET between multibulk commands
            request.append(b"GET " + op[1] + b"\r\n")
            replies.append(bulk(model.get(op[1])))
    return b"".join(request), b"".join(replies)


NOT_INTEGER = b"-ERR value is not an integer or out of range\r\n"


def _strict_int(text: bytes) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if -(2**63) <= value < 2**63 and b"%d" % value == text else None


def _add(model: dict[bytes, bytes], op: tuple) -> bytes:
    """INCR/DECR/INCRBY/DECRBY on the dict model: the reply Redis gives."""
    sign = 1 if op[1].lower().startswith(b"incr") else -1
    amount = _strict_int(op[3]) if op[0] == "incrby" else 1
    current = _strict_int(model[op[2]]) if op[2] in model else 0
    if amount is None or current is None:
        return NOT_INTEGER
    result = current + sign * amount
    if not -(2**63) <= result < 2**63:
        return b"-ERR increment or decrement would overflow\r\n"
    model[op[2]] = b"%d" % result
    return b":%d\r\n" % result


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return data


def expect(sock: socket.socket, replies: bytes) -> None:
    assert recv_exactly(sock, len(replies)) == replies


@pytest.fixture(scope="module", params=["commit", "everysec"])
def live(request, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp(request.param), durability=request.param)
    yield server
    server.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(OPS, min_size=1, max_size=40), st.lists(st.integers(min_value=0), max_size=6))
def test_generated_pipelines_answer_as_the_model_however_split(live, ops, cuts):
    with live.connect() as sock:
        sock.sendall(multibulk([b"FLUSHALL"]))
        expect(sock, b"+OK\r\n")
        data, expected = request_and_replies(ops, {})
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        for start, end in zip(points, points[1:]):
            sock.sendall(data[start:end])
        expect(sock, expected)


def test_big_replies_cut_the_plain_batch_and_the_rest_follows_in_order(tmp_path):
    server = start_server(tmp_path, max_bytes=256 << 20)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB
        with server.connect() as sock:
            sock.sendall(multibulk([b"SET", b"big", big]) + multibulk([b"SET", b"small", b"s"]))
            expect(sock, b"+OK\r\n+OK\r\n")
            # 12 MiB of GET replies: past the 4 MiB a batch may produce before it waits for
            # the client to read; the commands after the cut still run, in order.
            pipeline = [multibulk([b"GET", b"big"])] * 12 + [multibulk([b"PING"]), multibulk([b"GET", b"small"])]
            sock.sendall(b"".join(pipeline))
            expected = bulk(big) * 12 + b"+PONG\r\n" + bulk(b"s")
            expect(sock, expected)
    finally:
        server.stop()


def test_resp3_null_and_a_transaction_queue_are_respected(tmp_path):
    server = start_server(tmp_path)
    try:
        with server.connect() as sock:
            sock.sendall(multibulk([b"HELLO", b"3"]) + multibulk([b"PING"]))
            hello = b""
            while not hello.endswith(b"+PONG\r\n"):
                hello += sock.recv(4096)
            sock.sendall(multibulk([b"GET", b"missing"]) + multibulk([b"SET", b"k", b"v"]) + multibulk([b"GET", b"k"]))
            expect(sock, b"_\r\n+OK\r\n$1\r\nv\r\n")
            # Inside MULTI a GET or SET is queued, not run: the plain path must not answer it.
            sock.sendall(multibulk([b"MULTI"]) + multibulk([b"SET", b"k", b"w"]) + multibulk([b"GET", b"k"]))
            expect(sock, b"+OK\r\n+QUEUED\r\n+QUEUED\r\n")
            sock.sendall(multibulk([b"EXEC"]))
            expect(sock, b"*2\r\n+OK\r\n$1\r\nw\r\n")
    finally:
        server.stop()


def test_before_auth_the_plain_path_answers_noauth(tmp_path):
    server = start_server(tmp_path, requirepass="secret")
    try:
        with server.connect() as sock:
            sock.sendall(multibulk([b"SET", b"k", b"v"]) + multibulk([b"GET", b"k"]))
            noauth = b"-NOAUTH Authentication required.\r\n"
            expect(sock, noauth * 2)
            sock.sendall(multibulk([b"AUTH", b"secret"]) + multibulk([b"SET", b"k", b"v"]) + multibulk([b"GET", b"k"]))
            expect(sock, b"+OK\r\n+OK\r\n$1\r\nv\r\n")
        assert server.call(lambda: server.archive.get(b"k")) == b"v"
    finally:
        server.stop()
