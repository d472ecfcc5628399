"""Writes of the newer string and keyspace commands go through group commit: they survive a
restart (values and TTLs), respect the L1 budget, and reach clients only once committed."""

from __future__ import annotations

import redis

from arca.archive import Archive, ArchiveConfig
from arca.commands.registry import CommandContext
from arca.protocol import ErrorReply
from arca.state import ClientState, ServerOptions, ServerState
from arca_harness import run


def _context(directory, max_bytes=8 << 20):
    archive = Archive(ArchiveConfig(directory=directory, max_bytes=max_bytes))
    state = ServerState.from_options(ServerOptions(port=0, max_bytes=max_bytes))
    return CommandContext(archive, ClientState(id=state.new_client_id()), state)


def test_writes_survive_a_restart(tmp_path):
    ctx = _context(tmp_path / "a")
    run(ctx, "SET", "src", "value", "EX", "1000")
    writes = [
        ("GETSET", "gs", "1"), ("MSETNX", "m1", "a", "m2", "b"), ("INCRBYFLOAT", "f", "2.5"),
        ("SETRANGE", "r", "2", "xy"), ("SETBIT", "bits", "9", "1"), ("COPY", "src", "copy"),
        ("RENAME", "src", "renamed"), ("SET", "g", "v"), ("GETEX", "g", "EXAT", "4102444800"),
        ("SET", "gone", "v"), ("GETEX", "gone", "PXAT", "1"), ("SET", "p", "v", "EX", "100"),
        ("GETEX", "p", "PERSIST"), ("SET", "old", "1"), ("RENAMENX", "old", "new"),
    ]
    for argv in writes:
        reply = run(ctx, *argv)
        assert not isinstance(reply, ErrorReply), (argv, reply)
    ctx.archive.commit()
    ctx.archive.close()

    ctx = _context(tmp_path / "a")
    values = {key: run(ctx, "GET", key) for key in
              ("gs", "m1", "m2", "f", "r", "bits", "copy", "renamed", "src", "g", "gone", "p", "old", "new")}
    assert values == {"gs": b"1", "m1": b"a", "m2": b"b", "f": b"2.5", "r": b"\x00\x00xy", "bits": b"\x00\x40",
                      "copy": b"value", "renamed": b"value", "src": None, "g": b"v", "gone": None, "p": b"v",
                      "old": None, "new": b"1"}
    assert 990 < run(ctx, "TTL", "copy") <= 1000 and 990 < run(ctx, "TTL", "renamed") <= 1000
    assert run(ctx, "EXPIRETIME", "g") == 4102444800
    assert run(ctx, "TTL", "p") == -1
    ctx.archive.close()


def test_growing_values_respect_the_budget(tmp_path):
    ctx = _context(tmp_path / "b", max_bytes=1 << 20)
    for i in range(40):
        run(ctx, "SETRANGE", f"k{i}", str(64 << 10), "x")  # 64 KiB each: the oldest are evicted
        run(ctx, "SETBIT", f"b{i}", str(8 * (16 << 10)), "1")
    table = ctx.archive._entries.table
    assert table.used_bytes <= table.max_bytes
    assert run(ctx, "EXISTS", "k39") == 1 and run(ctx, "EXISTS", "k0") == 0
    ctx.archive.close()


def test_replies_wait_for_the_commit_over_a_real_server(arca):
    client = redis.Redis(host=arca.host, port=arca.port)
    commits = arca.call(lambda: arca.archive.info()["persistence"]["commits"])
    assert client.setrange("k", 0, "abc") == 3
    assert client.getex("k", ex=100) == b"abc"
    assert client.copy("k", "k2") is True
    assert arca.call(lambda: arca.archive.pending_writes) == 0
    assert arca.call(lambda: arca.archive.info()["persistence"]["commits"]) >= commits + 3
    client.close()
