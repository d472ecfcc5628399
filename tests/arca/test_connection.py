"""One connection over raw sockets: exact reply bytes, pipelining, inline commands, malformed
input (error reply, which connection closes, others unaffected), auth and its tight limits,
replies that wait for the client to read."""

from __future__ import annotations

import socket
import time

import pytest

from arca.protocol import Limits
from arca_harness import exchange, is_closed, recv_exactly


@pytest.mark.parametrize(
    "request_bytes, reply",
    [
        (b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n"),
        (b"PING\r\n", b"+PONG\r\n"),
        (b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", b"+OK\r\n$2\r\nv1\r\n"),
        (b"GET missing\r\n", b"$-1\r\n"),
        (b"INCR n\r\nINCRBY n 9\r\n", b":1\r\n:10\r\n"),
        (b"MGET a b\r\n", b"*2\r\n$-1\r\n$-1\r\n"),
        (b"FOO bar\r\n", b"-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n"),
        (b"GET\r\n", b"-ERR wrong number of arguments for 'get' command\r\n"),
        (b"HELLO 3\r\nGET nope\r\n", None),
        (b"echo \"a\\x00b\"\r\n", b"$3\r\na\x00b\r\n"),
    ],
)
def test_exact_reply_bytes(arca, request_bytes, reply):
    if reply is None:  # HELLO 3 switches the connection to RESP3: nulls become '_'
        with arca.connect() as sock:
            sock.sendall(request_bytes)
            data = b""
            while not data.endswith(b"_\r\n"):
                data += sock.recv(4096)
            assert data.startswith(b"%8\r\n$6\r\nserver\r\n$5\r\nredis\r\n")
        return
    assert exchange(arca, request_bytes, reply) == reply


def test_pipelined_burst_is_answered_in_order(arca):
    commands = b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$%d\r\n%d\r\n" % (
        len(b"k%d" % i), i, len(b"%d" % i), i) for i in range(2000))
    commands += b"".join(b"GET k%d\r\n" % i for i in range(2000))
    expected = b"+OK\r\n" * 2000 + b"".join(b"$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(2000))
    assert exchange(arca, commands, expected) == expected


def test_command_errors_keep_the_connection(arca):
    with arca.connect() as sock:
        sock.sendall(b"NOPE\r\nSET k\r\nINCR k k\r\nPING\r\n")
        expected = (b"-ERR unknown command 'NOPE', with args beginning with: \r\n"
                    b"-ERR wrong number of arguments for 'set' command\r\n"
                    b"-ERR wrong number of arguments for 'incr' command\r\n+PONG\r\n")
        assert recv_exactly(sock, expected) == expected


@pytest.mark.parametrize(
    "garbage, error",
    [
        (b"*1\r\n$x\r\n", b"invalid bulk length"),
        (b"*abc\r\n", b"invalid multibulk length"),
        (b"*1\r\n+PING\r\n", b"expected '$', got '+'"),
        (b'SET a "b\r\n', b"unbalanced quotes in request"),
        (b"*1\r\n$%d\r\n" % (64 * 1024 * 1024 + 1), b"invalid bulk length"),
        (b"*%d\r\n" % (1024 * 1024 + 1), b"invalid multibulk length"),
        (b"x" * (64 * 1024 + 10), b"too big inline request"),
    ],
)
def test_protocol_errors_close_only_that_connection(arca, garbage, error):
    with arca.connect() as bystander, arca.connect() as sock:
        bystander.sendall(b"SET before 1\r\n")
        assert recv_exactly(bystander, b"+OK\r\n") == b"+OK\r\n"
        sock.sendall(b"PING\r\n" + garbage)
        expected = b"+PONG\r\n-ERR Protocol error: " + error + b"\r\n"
        assert recv_exactly(sock, expected) == expected
        assert is_closed(sock)
        bystander.sendall(b"GET before\r\n")
        assert recv_exactly(bystander, b"$1\r\n1\r\n") == b"$1\r\n1\r\n"
    assert arca.state.stats.protocol_errors == 1


def test_query_buffer_limit_closes_the_connection(arca_factory):
    server = arca_factory(limits=Limits(max_bulk_len=1024, max_query_buffer=4096, max_multibulk_len=1000))
    with server.connect() as sock:
        sock.sendall(b"*1000\r\n" + b"$1000\r\n" + b"a" * 1000 + b"\r\n")
        sock.sendall((b"$1000\r\n" + b"a" * 1000 + b"\r\n") * 4)
        reply = recv_exactly(sock, b"-ERR Protocol error: client query buffer limit exceeded\r\n")
        assert reply == b"-ERR Protocol error: client query buffer limit exceeded\r\n"
        assert is_closed(sock)


def test_quit_closes_after_its_reply(arca):
    with arca.connect() as sock:
        sock.sendall(b"PING\r\nQUIT\r\nPING\r\n")
        assert recv_exactly(sock, b"+PONG\r\n+OK\r\n") == b"+PONG\r\n+OK\r\n"
        assert is_closed(sock)


def test_requirepass_over_the_wire(arca_factory):
    server = arca_factory(requirepass="hunter2")
    with server.connect() as sock:
        sock.sendall(b"GET k\r\nAUTH nope\r\nAUTH hunter2\r\nGET k\r\n")
        expected = (b"-NOAUTH Authentication required.\r\n"
                    b"-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n$-1\r\n")
        assert recv_exactly(sock, expected) == expected


def test_a_client_that_does_not_read_cannot_grow_server_memory(arca):
    value = b"v" * (1 << 20)
    with arca.connect() as writer:
        writer.sendall(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n%s\r\n" % (len(value), value))
        assert recv_exactly(writer, b"+OK\r\n") == b"+OK\r\n"
    reply = b"$%d\r\n%s\r\n" % (len(value), value)
    with arca.connect() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"GET big\r\n" * 200)  # 200 MiB of replies if all were produced at once
        time.sleep(0.5)
        buffered = arca.call(lambda: max(
            c.output_buffer() for c in arca.state.clients.values()))
        assert buffered < 16 << 20
        received = 0
        while received < 200 * len(reply):
            chunk = sock.recv(1 << 20)
            assert chunk
            received += len(chunk)
        assert received == 200 * len(reply)
        sock.sendall(b"PING\r\n")
        assert recv_exactly(sock, b"+PONG\r\n") == b"+PONG\r\n"


def test_unauthenticated_clients_get_tight_limits_until_auth(arca_factory):
    server = arca_factory(requirepass="pw")
    big = b"z" * 20_000
    with server.connect() as stranger:
        stranger.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % len(big))
        expected = b"-ERR Protocol error: unauthenticated bulk length\r\n"
        assert recv_exactly(stranger, expected) == expected
        assert is_closed(stranger)
    with server.connect() as stranger:
        stranger.sendall(b"*11\r\n")
        expected = b"-ERR Protocol error: unauthenticated multibulk length\r\n"
        assert recv_exactly(stranger, expected) == expected
    with server.connect() as member:
        member.sendall(b"AUTH pw\r\n")
        assert recv_exactly(member, b"+OK\r\n") == b"+OK\r\n"
        member.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n" % (len(big), big))
        assert recv_exactly(member, b"+OK\r\n") == b"+OK\r\n"


def test_a_command_returning_garbage_answers_an_error_and_the_server_goes_on(arca):
    from arca.commands.registry import _TABLE, command

    @command("TEST.GARBAGE", arity=1)
    def garbage(ctx, argv):
        return object()

    @command("TEST.BUG", arity=1)
    def bug(ctx, argv):
        raise RuntimeError("a bug")

    try:
        with arca.connect() as sock:
            sock.sendall(b"TEST.GARBAGE\r\nTEST.BUG\r\nPING\r\n")
            expected = (b"-ERR internal error: the command produced an invalid reply; see the server log\r\n"
                        b"-ERR internal error while running 'test.bug'; see the server log\r\n+PONG\r\n")
            assert recv_exactly(sock, expected) == expected
    finally:
        for name in (b"test.garbage", b"TEST.GARBAGE", b"test.bug", b"TEST.BUG"):
            _TABLE.pop(name)


def test_get_and_set_in_a_batch_respect_multi_auth_and_the_budget(arca_factory):
    server = arca_factory(requirepass="pw", max_bytes=4096)
    with server.connect() as sock:
        sock.sendall(b"SET a 1\r\nAUTH pw\r\nMULTI\r\nSET a 2\r\nGET a\r\nEXEC\r\nGET a\r\n"
                     b"SET big " + b"x" * 8000 + b"\r\nGET big\r\n")
        expected = (b"-NOAUTH Authentication required.\r\n+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n"
                    b"*2\r\n+OK\r\n$1\r\n2\r\n$1\r\n2\r\n"
                    b"-OOM command not allowed when used memory > 'maxmemory'.\r\n$-1\r\n")
        assert recv_exactly(sock, expected) == expected


def test_a_pipelined_run_of_sets_refuses_only_the_one_over_the_budget(arca_factory):
    server = arca_factory(max_bytes=4096)
    sets = [(b"a", b"1"), (b"b", b"2"), (b"big", b"x" * 8000), (b"c", b"3")]
    burst = b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(k), k, len(v), v) for k, v in sets)
    expected = b"+OK\r\n+OK\r\n-OOM command not allowed when used memory > 'maxmemory'.\r\n+OK\r\n"
    with server.connect() as sock:
        sock.sendall(burst)  # SETs only: one read takes the batched path
        assert recv_exactly(sock, expected) == expected
        sock.sendall(b"GET a\r\nGET big\r\nGET c\r\n")
        assert recv_exactly(sock, b"$1\r\n1\r\n$-1\r\n$1\r\n3\r\n") == b"$1\r\n1\r\n$-1\r\n$1\r\n3\r\n"
