"""Server commands through dispatch: DBSIZE FLUSH* INFO CONFIG TIME and COMMAND from the registry."""

from __future__ import annotations

import time

from arca.commands.registry import all_specs
from arca.protocol import NO_REPLY, ErrorReply, Status
from arca_harness import run


def test_dbsize_and_flush(ctx):
    run(ctx, "MSET", "a", "1", "b", "2")
    assert run(ctx, "DBSIZE") == 2
    assert run(ctx, "FLUSHDB") == Status("OK")
    assert run(ctx, "DBSIZE") == 0
    run(ctx, "SET", "a", "1")
    assert run(ctx, "FLUSHALL", "ASYNC") == Status("OK")
    assert run(ctx, "DBSIZE") == 0
    assert run(ctx, "FLUSHALL", "LATER") == ErrorReply("ERR syntax error")


def test_info_sections(ctx):
    run(ctx, "SET", "a", "1")
    text = run(ctx, "INFO").decode()
    for header in ("# Server", "# Clients", "# Memory", "# Persistence", "# Stats", "# Keyspace", "# Arca"):
        assert header in text
    assert "redis_version:" in text and "connected_clients:1" in text
    assert "db0:keys=1," in text
    assert "\r\nused_memory:" in text  # redis-cli --stat reads it
    only = run(ctx, "INFO", "clients").decode()
    assert only.startswith("# Clients\r\n") and "# Server" not in only
    assert run(ctx, "INFO", "keyspace", "SERVER").decode().count("# ") == 2


def test_config_get_answers_what_stock_tools_ask(ctx):
    assert run(ctx, "CONFIG", "GET", "save") == {b"save": b""}
    assert run(ctx, "CONFIG", "GET", "appendonly") == {b"appendonly": b"yes"}
    assert run(ctx, "CONFIG", "GET", "maxmemory")[b"maxmemory"] == str(8 << 20).encode()
    assert run(ctx, "CONFIG", "GET", "databases") == {b"databases": b"1"}
    many = run(ctx, "CONFIG", "GET", "max*", "port")
    assert set(many) == {b"maxmemory", b"maxmemory-policy", b"maxclients", b"port"}
    assert run(ctx, "CONFIG", "GET", "requirepass") == {}  # never readable
    assert run(ctx, "CONFIG", "GET", "nothing-like-this") == {}


def test_config_set(ctx):
    assert run(ctx, "CONFIG", "SET", "maxclients", "5") == Status("OK")
    assert ctx.server.maxclients == 5
    assert run(ctx, "CONFIG", "SET", "requirepass", "pw") == Status("OK")
    assert ctx.server.requirepass == "pw"
    assert run(ctx, "CONFIG", "SET", "requirepass", "") == Status("OK")
    assert ctx.server.requirepass is None
    assert run(ctx, "CONFIG", "SET", "port", "1") == ErrorReply(
        "ERR CONFIG SET failed (possibly related to argument 'port') - can't set immutable config")
    assert run(ctx, "CONFIG", "SET", "bogus", "1") == ErrorReply(
        "ERR Unknown option or number of arguments for CONFIG SET - 'bogus'")
    assert run(ctx, "CONFIG", "SET", "maxclients", "many") == ErrorReply(
        "ERR CONFIG SET failed (possibly related to argument 'maxclients') - argument couldn't be parsed into an integer")
    assert run(ctx, "CONFIG", "RESETSTAT") == Status("OK")


def test_time(ctx):
    seconds, micros = run(ctx, "TIME")
    assert abs(int(seconds) - time.time()) < 5 and 0 <= int(micros) < 1_000_000


def test_command_family_is_generated_from_the_registry(ctx):
    count = run(ctx, "COMMAND", "COUNT")
    assert count == len(all_specs()) and count >= 40
    names = run(ctx, "COMMAND", "LIST")
    assert {b"get", b"set", b"client", b"command", b"hello"} <= set(names)
    info = run(ctx, "COMMAND", "INFO", "get", "nosuch")
    assert info[0][:6] == [b"get", 2, [Status("readonly"), Status("fast")], 1, 1, 1]
    assert info[1] is None
    everything = run(ctx, "COMMAND")
    assert len(everything) == count
    docs = run(ctx, "COMMAND", "DOCS", "set", "client")
    assert docs[b"set"][b"summary"] and docs[b"set"][b"group"] == b"string"
    argument_names = [arg[b"name"] for arg in docs[b"set"][b"arguments"]]
    assert argument_names[:2] == [b"key", b"value"]
    assert b"client|setname" in docs[b"client"][b"subcommands"]
    assert len(run(ctx, "COMMAND", "DOCS")) == count


def test_shutdown(ctx):
    assert run(ctx, "SHUTDOWN") == ErrorReply("ERR SHUTDOWN is not available in this process")
    requests = []
    ctx.server.request_shutdown = lambda: requests.append(True)
    assert run(ctx, "SHUTDOWN", "LATER") == ErrorReply("ERR syntax error")
    assert run(ctx, "SHUTDOWN", "NOSAVE") is NO_REPLY
    assert requests == [True] and ctx.client.close_after_reply
