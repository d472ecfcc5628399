"""Protected mode holds at run time (no password: only loopback clients), and CONFIG SET
maxclients checks its range with Redis's errors."""

from __future__ import annotations

import socket

import pytest

import arca.connection as connection_module
from arca.commands.registry import ErrorReply, Status
from arca.config import is_loopback
from arca_harness import run


class Client:
    """A raw connection read one reply line at a time."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        self.sock, self.reader = sock, sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        return self.reader.readline()

    def closed(self) -> bool:
        try:
            return self.reader.read(1) == b""
        except ConnectionResetError:
            return True

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.reader.close()
        self.sock.close()


@pytest.fixture
def from_afar(monkeypatch):
    """Every client counts as remote (the tests only reach 127.0.0.1)."""
    monkeypatch.setattr(connection_module, "is_loopback", lambda host: False)


def test_removing_the_password_keeps_remote_strangers_out(arca_factory, from_afar):
    server = arca_factory(requirepass="secret")
    with Client(server.connect()) as stranger, Client(server.connect()) as admin:
        admin.send(b"AUTH secret\r\nSET k v\r\n")
        assert admin.line() == b"+OK\r\n" and admin.line() == b"+OK\r\n"
        admin.send(b'CONFIG SET requirepass ""\r\n')
        assert admin.line() == b"+OK\r\n"
        # A remote client that never authenticated is not let in by the missing password...
        stranger.send(b"GET k\r\n")
        assert stranger.line().startswith(b"-DENIED protected mode")
        assert stranger.closed()
        # ...nor is a new one, at connection time...
        with Client(server.connect()) as newcomer:
            assert newcomer.line().startswith(b"-DENIED ")
            assert newcomer.closed()
        # ...while a client that authenticated goes on.
        admin.send(b"GET k\r\n")
        assert admin.line() == b"$1\r\n" and admin.line() == b"v\r\n"
        admin.send(b"CONFIG SET requirepass again\r\n")
        assert admin.line() == b"+OK\r\n"
    with Client(server.connect()) as later:  # a password again: remote clients may AUTH
        later.send(b"AUTH again\r\nPING\r\n")
        assert later.line() == b"+OK\r\n" and later.line() == b"+PONG\r\n"


def test_protected_mode_off_serves_remote_clients_without_password(arca_factory, from_afar):
    server = arca_factory(protected_mode=False)
    with Client(server.connect()) as sock:
        sock.send(b"PING\r\n")
        assert sock.line() == b"+PONG\r\n"


def test_loopback_clients_are_served_without_password(arca_factory):
    server = arca_factory(requirepass="secret")
    with Client(server.connect()) as admin:
        admin.send(b'AUTH secret\r\nCONFIG SET requirepass ""\r\n')
        assert admin.line() == b"+OK\r\n" and admin.line() == b"+OK\r\n"
    with Client(server.connect()) as local:
        local.send(b"PING\r\n")
        assert local.line() == b"+PONG\r\n"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.5.6.7", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("10.0.0.1", False), ("192.168.1.2", False), ("::ffff:10.0.0.1", False),
    ("2001:db8::1", False), ("0.0.0.0", False), ("fe80::1%eth0", False), ("?", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


_FAILED = "ERR CONFIG SET failed (possibly related to argument 'maxclients') - "
_RANGE = _FAILED + "argument must be between 1 and 4294967295 inclusive"
_PARSE = _FAILED + "argument couldn't be parsed into an integer"


@pytest.mark.parametrize("value, reply", [
    ("1", Status("OK")), ("10000", Status("OK")), ("4294967295", Status("OK")),
    ("0", ErrorReply(_RANGE)), ("-1", ErrorReply(_RANGE)), ("4294967296", ErrorReply(_RANGE)),
    ("9223372036854775807", ErrorReply(_RANGE)),
    ("99999999999999999999", ErrorReply(_PARSE)), ("abc", ErrorReply(_PARSE)), ("+5", ErrorReply(_PARSE)),
    (" 5", ErrorReply(_PARSE)), ("05", ErrorReply(_PARSE)), ("1k", ErrorReply(_PARSE)), ("", ErrorReply(_PARSE)),
])
def test_config_set_maxclients_range_as_redis(ctx, value, reply):
    before = ctx.server.maxclients
    assert run(ctx, "CONFIG", "SET", "maxclients", value) == reply
    assert ctx.server.maxclients == (int(value) if reply == "OK" else before)
