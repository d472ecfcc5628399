"""Connection commands through dispatch: PING ECHO SELECT AUTH HELLO RESET QUIT CLIENT, unknown commands."""

from __future__ import annotations

import pytest

from arca.protocol import ErrorReply, Status
from arca_harness import run


def test_ping_echo_select(ctx):
    assert run(ctx, "PING") == Status("PONG")
    assert run(ctx, "PING", "hi") == b"hi"
    assert run(ctx, "PING", "a", "b") == ErrorReply("ERR wrong number of arguments for 'ping' command")
    assert run(ctx, "ECHO", b"\x00x") == b"\x00x"
    assert run(ctx, "SELECT", "0") == Status("OK")
    assert run(ctx, "SELECT", "1") == ErrorReply("ERR DB index is out of range")
    assert run(ctx, "SELECT", "x") == ErrorReply("ERR value is not an integer or out of range")


def test_unknown_command_and_subcommand_messages(ctx):
    assert run(ctx, "FOO") == ErrorReply("ERR unknown command 'FOO', with args beginning with: ")
    assert run(ctx, "foo", "a", "b c") == ErrorReply(
        "ERR unknown command 'foo', with args beginning with: 'a' 'b c' ")
    long_args = run(ctx, "foo", "x" * 200, "y")
    assert long_args == ErrorReply(f"ERR unknown command 'foo', with args beginning with: '{'x' * 128}' ")
    assert run(ctx, "CLIENT", "NOPE") == ErrorReply("ERR unknown subcommand 'NOPE'. Try CLIENT HELP.")
    assert run(ctx, "CLIENT") == ErrorReply("ERR wrong number of arguments for 'client' command")
    assert run(ctx, "CLIENT", "SETNAME") == ErrorReply(
        "ERR wrong number of arguments for 'client|setname' command")
    assert b"HELP" in run(ctx, "CLIENT", "HELP")


def test_auth_without_a_password_configured(ctx):
    assert run(ctx, "AUTH", "secret") == ErrorReply(
        "ERR AUTH <password> called without any password configured for the default user. "
        "Are you sure your configuration is correct?")


def test_requirepass_gates_everything_but_auth_hello_quit(ctx):
    ctx.server.requirepass = "s3cret"
    ctx.client.authenticated = False
    assert run(ctx, "GET", "k") == ErrorReply("NOAUTH Authentication required.")
    assert run(ctx, "PING") == ErrorReply("NOAUTH Authentication required.")
    assert run(ctx, "NOSUCH").startswith("ERR unknown command")  # Redis checks the name first
    assert run(ctx, "HELLO", "3").startswith("NOAUTH HELLO must be called")
    assert run(ctx, "AUTH", "wrong") == ErrorReply(
        "WRONGPASS invalid username-password pair or user is disabled.")
    assert run(ctx, "AUTH", "admin", "s3cret") == ErrorReply(
        "WRONGPASS invalid username-password pair or user is disabled.")
    assert run(ctx, "AUTH", "a", "b", "c") == ErrorReply("ERR syntax error")
    assert run(ctx, "AUTH", "s3cret") == Status("OK")
    assert run(ctx, "GET", "k") is None
    assert run(ctx, "RESET") == Status("RESET")
    assert run(ctx, "GET", "k") == ErrorReply("NOAUTH Authentication required.")
    reply = run(ctx, "HELLO", "3", "AUTH", "default", "s3cret", "SETNAME", "worker-1")
    assert reply[b"proto"] == 3 and ctx.client.resp == 3 and ctx.client.name == b"worker-1"
    assert run(ctx, "QUIT") == Status("OK") and ctx.client.close_after_reply


def test_removing_the_password_lets_waiting_clients_in(ctx):
    ctx.server.requirepass = "s3cret"
    ctx.client.authenticated = False
    assert run(ctx, "GET", "k") == ErrorReply("NOAUTH Authentication required.")
    ctx.server.requirepass = None
    assert run(ctx, "GET", "k") is None


def test_hello(ctx):
    reply = run(ctx, "HELLO")
    assert reply[b"proto"] == 2 and reply[b"server"] == b"redis" and reply[b"id"] == ctx.client.id
    assert run(ctx, "HELLO", "3")[b"proto"] == 3
    assert ctx.client.resp == 3
    assert run(ctx, "HELLO", "4") == ErrorReply("NOPROTO unsupported protocol version")
    assert run(ctx, "HELLO", "x") == ErrorReply("ERR Protocol version is not an integer or out of range")
    assert run(ctx, "HELLO", "2", "BOGUS") == ErrorReply("ERR Syntax error in HELLO option 'BOGUS'")
    assert run(ctx, "HELLO", "2", "AUTH", "default", "x") == ErrorReply(
        "WRONGPASS invalid username-password pair or user is disabled.")
    assert ctx.client.resp == 3  # a failed HELLO changes nothing


def test_client_subcommands(ctx):
    assert run(ctx, "CLIENT", "ID") == ctx.client.id
    assert run(ctx, "CLIENT", "GETNAME") is None
    assert run(ctx, "CLIENT", "SETNAME", "node-a") == Status("OK")
    assert run(ctx, "CLIENT", "GETNAME") == b"node-a"
    assert run(ctx, "CLIENT", "SETNAME", "has space") == ErrorReply(
        "ERR Client names cannot contain spaces, newlines or special characters.")
    assert run(ctx, "CLIENT", "SETINFO", "LIB-NAME", "redis-py") == Status("OK")
    assert run(ctx, "CLIENT", "SETINFO", "LIB-VER", "8.0") == Status("OK")
    assert run(ctx, "CLIENT", "SETINFO", "COLOR", "x") == ErrorReply("ERR Unrecognized option 'COLOR'")
    listing = run(ctx, "CLIENT", "LIST").decode()
    assert f"id={ctx.client.id} " in listing and "name=node-a" in listing and "lib-name=redis-py" in listing
    assert listing.endswith("\n")
    assert run(ctx, "CLIENT", "LIST", "ID", str(ctx.client.id + 100)) == b""
    assert run(ctx, "CLIENT", "LIST", "TYPE", "pubsub") == b""
    info = run(ctx, "CLIENT", "INFO").decode()
    assert info.startswith(f"id={ctx.client.id} ") and "lib-ver=8.0" in info


@pytest.mark.parametrize("name", ["get", "GET", "Get"])
def test_names_are_case_insensitive(ctx, name):
    run(ctx, "SET", "k", "v")
    assert run(ctx, name, "k") == b"v"
