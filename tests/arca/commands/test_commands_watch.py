"""WATCH/UNWATCH with MULTI/EXEC: through dispatch with two connections on one archive, and
through a real server with raw sockets and redis-py (RESP2 and RESP3)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from arca.commands.registry import CommandContext
from arca.protocol import NULL_ARRAY, ErrorReply, Status
from arca.state import ClientState
from arca_harness import run

OK = Status("OK")


@pytest.fixture
def other(ctx):
    """A second connection on the same archive and server."""
    client = ClientState(id=ctx.server.new_client_id())
    ctx.server.clients[client.id] = client
    return CommandContext(ctx.archive, client, ctx.server)


def _transaction(ctx, *commands):
    assert run(ctx, "MULTI") == OK
    for argv in commands:
        assert run(ctx, *argv) == Status("QUEUED")
    return run(ctx, "EXEC")


def test_exec_runs_when_nothing_changed(ctx, other):
    run(ctx, "SET", "k", "1")
    assert run(ctx, "WATCH", "k", "missing") == OK
    run(other, "GET", "k")  # reads never count
    run(other, "SET", "k", "2", "NX")  # nor writes that change nothing
    run(other, "EXPIRE", "missing", "10")
    assert run(other, "SETBIT", "k", "2", "1") == 1  # "1" is 0x31: that bit is set already
    run(other, "PERSIST", "k")
    run(other, "GETEX", "k", "PERSIST")
    run(other, "RENAME", "k", "k")
    run(other, "SETRANGE", "k", "0", "")
    assert _transaction(ctx, ("INCR", "k")) == [2]


@pytest.mark.parametrize("change", [
    ("SET", "k", "1"),  # the same value still counts, as in Redis
    ("DEL", "k"), ("EXPIRE", "k", "100"), ("INCR", "k"), ("APPEND", "k", "x"), ("SETRANGE", "k", "0", "9"),
    ("SETBIT", "k", "1", "1"), ("RENAME", "k", "k2"), ("GETEX", "k", "EX", "50"), ("INCRBYFLOAT", "k", "1"),
    ("MSET", "k", "5"), ("FLUSHALL",),
])
def test_a_change_by_another_connection_fails_exec(ctx, other, change):
    run(ctx, "SET", "k", "1")
    ctx.archive.commit()
    run(ctx, "WATCH", "k")
    run(other, *change)
    assert _transaction(ctx, ("SET", "k", "mine")) is NULL_ARRAY
    assert run(ctx, "GET", "k") != b"mine"


def test_a_change_by_the_same_connection_and_a_new_key(ctx):
    run(ctx, "WATCH", "new")
    run(ctx, "SET", "new", "x")
    assert _transaction(ctx, ("PING",)) is NULL_ARRAY
    assert ctx.client.watch is None  # EXEC forgets the watched keys either way
    assert _transaction(ctx, ("PING",)) == [Status("PONG")]


def test_a_key_written_before_watch_and_not_committed(ctx, other):
    run(ctx, "SET", "k", "1")  # pending: the change after WATCH must still be seen
    assert ctx.archive.pending_writes
    run(ctx, "WATCH", "k")
    assert not ctx.archive.pending_writes  # WATCH committed first
    run(other, "SET", "k", "1")
    assert _transaction(ctx, ("GET", "k")) is NULL_ARRAY


def test_a_change_committed_before_exec_is_seen(ctx, other):
    run(ctx, "SET", "k", "1")
    run(ctx, "WATCH", "k")
    run(other, "SET", "k", "2")
    ctx.archive.commit()  # the commit empties the table's list of changed keys
    run(other, "GET", "k")
    assert _transaction(ctx, ("GET", "k")) is NULL_ARRAY


def test_an_expired_key_fails_exec(ctx):
    run(ctx, "SET", "k", "1", "PX", "30")
    run(ctx, "WATCH", "k")
    time.sleep(0.06)
    assert _transaction(ctx, ("PING",)) is NULL_ARRAY


def test_an_evicted_key_fails_exec(ctx):
    run(ctx, "SET", "k", "1")
    run(ctx, "WATCH", "k")
    for i in range(10):
        run(ctx, "SET", f"big{i}", b"x" * (1 << 20))  # the fixture's budget is 8 MiB
    assert run(ctx, "EXISTS", "k") == 0
    assert _transaction(ctx, ("PING",)) is NULL_ARRAY


def test_flush_fails_only_watchers_of_existing_keys(ctx, other):
    run(ctx, "WATCH", "absent")
    run(other, "SET", "present", "1")
    ctx.archive.commit()
    run(other, "WATCH", "present")
    run(ctx, "FLUSHALL")
    assert _transaction(other, ("PING",)) is NULL_ARRAY
    # "absent" did not exist when the keyspace was flushed: its watcher goes on
    assert _transaction(ctx, ("PING",)) == [Status("PONG")]


def test_unwatch_discard_and_reset_forget_the_keys(ctx, other):
    run(ctx, "SET", "k", "1")
    for forget in (("UNWATCH",), ("MULTI", "DISCARD"), ("RESET",)):
        run(ctx, "WATCH", "k")
        for name in forget:
            run(ctx, name)
        assert ctx.client.watch is None and len(ctx.archive._entries.watches) == 0
        run(other, "SET", "k", "2")
        assert _transaction(ctx, ("PING",)) == [Status("PONG")]


def test_watch_inside_multi_is_refused_without_aborting(ctx):
    run(ctx, "MULTI")
    assert run(ctx, "WATCH", "k") == ErrorReply("ERR WATCH inside MULTI is not allowed")
    run(ctx, "SET", "k", "1")
    assert run(ctx, "EXEC") == [OK]


def test_no_multi_commands_abort_the_transaction(ctx):
    ctx.server.request_shutdown = lambda: pytest.fail("SHUTDOWN ran inside MULTI")
    run(ctx, "MULTI")
    assert run(ctx, "SHUTDOWN") == ErrorReply("ERR Command not allowed inside a transaction")
    assert run(ctx, "MULTI") == ErrorReply("ERR MULTI calls can not be nested")
    run(ctx, "SET", "k", "1")
    assert run(ctx, "EXEC") == ErrorReply("EXECABORT Transaction discarded because of previous errors.")
    assert run(ctx, "EXISTS", "k") == 0


def test_shutdown_inside_multi_over_a_real_server_keeps_serving(arca):
    sock = arca.connect()
    sock.sendall(b"MULTI\r\nSHUTDOWN\r\nEXEC\r\nPING\r\n")
    reply = b""
    while reply.count(b"\r\n") < 4:
        reply += sock.recv(4096)
    assert reply == (b"+OK\r\n-ERR Command not allowed inside a transaction\r\n"
                     b"-EXECABORT Transaction discarded because of previous errors.\r\n+PONG\r\n")
    sock.close()
    assert not arca.server.shutdown_requested.is_set()


@pytest.mark.parametrize("protocol, null", [(2, b"*-1\r\n"), (3, b"_\r\n")])
def test_plain_writes_from_other_clients_fail_exec(arca, protocol, null):
    watcher, writer = arca.connect(), arca.connect()
    if protocol == 3:
        watcher.sendall(b"HELLO 3\r\n")
        watcher.recv(4096)
    watcher.sendall(b"SET k 1\r\nWATCH k\r\n")
    assert _read(watcher, 2) == b"+OK\r\n+OK\r\n"
    writer.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n")  # served by the plain path in C
    assert _read(writer, 1) == b"+OK\r\n"
    watcher.sendall(b"MULTI\r\nINCR k\r\nEXEC\r\n")
    assert _read(watcher, 3) == b"+OK\r\n+QUEUED\r\n" + null
    watcher.close()
    writer.close()


def _read(sock, lines: int) -> bytes:
    data = b""
    while data.count(b"\r\n") < lines:
        data += sock.recv(4096)
    return data


def test_disconnect_forgets_the_watched_keys(arca):
    sock = arca.connect()
    sock.sendall(b"WATCH a b c\r\n")
    assert _read(sock, 1) == b"+OK\r\n"
    assert arca.call(lambda: len(arca.archive._entries.watches)) == 3
    sock.close()
    deadline = time.monotonic() + 5
    while arca.call(lambda: len(arca.archive._entries.watches)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arca.call(lambda: len(arca.archive._entries.watches)) == 0


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_optimistic_locking_counts_exactly(arca, protocol):
    clients = [redis.Redis(host=arca.host, port=arca.port, protocol=protocol) for _ in range(4)]
    clients[0].set("counter", 0)
    retries = []

    def work(client: redis.Redis) -> None:
        for _ in range(25):
            while True:
                with client.pipeline() as pipe:
                    try:
                        pipe.watch("counter")
                        value = int(pipe.get("counter"))
                        pipe.multi()
                        pipe.set("counter", value + 1)
                        pipe.execute()
                        break
                    except redis.WatchError:
                        retries.append(1)

    threads = [threading.Thread(target=work, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert int(clients[0].get("counter")) == 100
    with clients[0].pipeline() as pipe:
        pipe.watch("counter")
        clients[1].set("counter", 7)
        pipe.multi()
        pipe.incr("counter")
        with pytest.raises(redis.WatchError):
            pipe.execute()
    for client in clients:
        client.close()


def test_a_key_that_expired_before_watch_is_no_change(ctx):
    run(ctx, "SET", "k", "1", "PX", "20")
    ctx.archive.commit()
    time.sleep(0.05)  # past its deadline, still in the table: no active expiry has run
    run(ctx, "WATCH", "k")
    assert _transaction(ctx, ("PING",)) == [Status("PONG")]


def test_watch_commits_only_for_keys_with_uncommitted_changes(ctx):
    run(ctx, "SET", "a", "1")
    run(ctx, "WATCH", "b")
    assert ctx.archive.pending_writes  # "b" has no uncommitted change: nothing to commit
    run(ctx, "SET", "c", "1")
    run(ctx, "WATCH", "d")
    assert ctx.archive.pending_writes
    run(ctx, "WATCH", "c")
    assert not ctx.archive.pending_writes
    run(ctx, "SET", "e", "1")
    run(ctx, "WATCH", "a")  # committed earlier: its next change will be listed
    assert ctx.archive.pending_writes
    run(ctx, "SET", "a", "2")
    assert _transaction(ctx, ("PING",)) is NULL_ARRAY
