"""The server over raw sockets: max clients, maintenance while idle, graceful shutdown."""

from __future__ import annotations

import time

from arca.archive import Archive, ArchiveConfig
from arca_harness import is_closed, recv_exactly


def test_idle_server_rewrites_the_entry_log(arca):
    with arca.connect() as sock:
        for round_ in range(40):
            burst = b"".join(b"SET k%d v%d\r\n" % (i, round_) for i in range(300))
            sock.sendall(burst)
            assert recv_exactly(sock, b"+OK\r\n" * 300) == b"+OK\r\n" * 300
    assert arca.call(lambda: arca.archive.log_records) > 10_000
    deadline = time.monotonic() + 10
    while arca.call(lambda: arca.archive.log_records) > 300 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert arca.call(lambda: arca.archive.log_records) == 300
    assert arca.call(lambda: arca.archive.info()["persistence"]["log_rewrites"]) >= 1
    assert arca.call(lambda: arca.archive.dbsize()) == 300


def test_max_clients(arca_factory):
    server = arca_factory(maxclients=2)
    with server.connect() as a, server.connect() as b:
        for sock in (a, b):
            sock.sendall(b"PING\r\n")
            assert recv_exactly(sock, b"+PONG\r\n") == b"+PONG\r\n"
        with server.connect() as c:
            assert recv_exactly(c, b"-ERR max number of clients reached\r\n") == (
                b"-ERR max number of clients reached\r\n")
            assert is_closed(c)
    assert server.state.stats.rejected_connections == 1


def test_graceful_shutdown_answers_and_commits_in_flight_writes(tmp_path, arca_factory):
    server = arca_factory()
    sock = server.connect()
    sock.sendall(b"".join(b"SET key%d value%d\r\n" % (i, i) for i in range(500)))
    assert recv_exactly(sock, b"+OK\r\n" * 500) == b"+OK\r\n" * 500
    sock.sendall(b"SET last one\r\n")
    time.sleep(0.1)
    server.stop()
    assert recv_exactly(sock, b"+OK\r\n") == b"+OK\r\n"
    assert is_closed(sock)
    sock.close()
    reopened = Archive(ArchiveConfig(directory=tmp_path / "s0" / "arca"))
    try:
        assert reopened.get(b"key499") == b"value499" and reopened.get(b"last") == b"one"
    finally:
        reopened.close()
