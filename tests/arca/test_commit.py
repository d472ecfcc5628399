"""Group commit: acknowledged writes are committed, one commit per event-loop tick (everysec:
acknowledged first, committed within a second or two). A commit that fails (a full disk):
reads go on, writes get -MISCONF, the writes of the failed commit are never acknowledged
until a retry commits them, the condition is logged once, and the server recovers by itself."""

from __future__ import annotations

import logging
import socket
import time

import pytest

import arca.commit as commit_module
from arca.archive import ArchiveError
from arca_harness import recv_exactly


class FlakyDisk:
    """Stands in for Archive.commit: fails while `full`, then commits for real."""

    def __init__(self, archive) -> None:
        self.real = archive.commit
        self.full = True
        self.attempts = 0

    def __call__(self) -> None:
        self.attempts += 1
        if self.full:
            raise ArchiveError("commit to archive.db failed: database or disk is full")
        self.real()


def read_reply(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    try:
        return sock.recv(65536)
    except socket.timeout:
        return b""


@pytest.mark.parametrize("durability", ["commit", "everysec"])
def test_failed_commits_refuse_writes_serve_reads_and_recover(arca_factory, monkeypatch, caplog, durability):
    monkeypatch.setattr(commit_module, "COMMIT_RETRY_SECONDS", 0.1)
    arca = arca_factory(durability=durability)
    with arca.connect() as sock:
        sock.sendall(b"SET kept before\r\n")
        assert read_reply(sock, 5) == b"+OK\r\n"
    time.sleep(1.2 if durability == "everysec" else 0)  # everysec: let the timer commit it
    disk = FlakyDisk(arca.archive)
    arca.archive.commit = disk
    caplog.set_level(logging.INFO, logger="arca.commit")
    with arca.connect() as writer, arca.connect() as reader:
        writer.sendall(b"SET lost-or-late value\r\n")
        if durability == "commit":
            assert read_reply(writer, 0.5) == b""  # its commit failed: not acknowledged
        else:
            assert read_reply(writer, 5) == b"+OK\r\n"  # everysec acknowledges before committing
            deadline = time.monotonic() + 5
            while arca.state.persistence_error is None and time.monotonic() < deadline:
                time.sleep(0.05)
        assert arca.state.persistence_error is not None
        reader.sendall(b"GET kept\r\nPING\r\nSET x y\r\nMSET a 1 b 2\r\nINCR n\r\nGET x\r\n")
        replies = b""
        while replies.count(b"\r\n") < 7:
            chunk = read_reply(reader, 5)
            assert chunk, replies
            replies += chunk
        lines = replies.split(b"\r\n")
        assert lines[:3] == [b"$6", b"before", b"+PONG"]
        assert all(line.startswith(b"-MISCONF ") for line in lines[3:6]), lines
        assert lines[6] == b"$-1"  # the refused SET changed nothing
        reader.sendall(b"MULTI\r\nSET t 1\r\nEXEC\r\n")
        replies = b""
        while replies.count(b"\r\n") < 3:
            replies += read_reply(reader, 5)
        assert replies.startswith(b"+OK\r\n-MISCONF ") and b"-EXECABORT" in replies
        time.sleep(0.5)  # several retries fail meanwhile
        assert disk.attempts >= 3
        disk.full = False
        if durability == "commit":
            assert read_reply(writer, 5) == b"+OK\r\n"  # acknowledged once a retry committed it
        deadline = time.monotonic() + 5
        while arca.state.persistence_error is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.sendall(b"SET x y\r\nGET lost-or-late\r\n")
        replies = b""
        while replies.count(b"\r\n") < 3:
            replies += read_reply(reader, 5)
        assert replies == b"+OK\r\n$5\r\nvalue\r\n"
    failures = [r for r in caplog.records if r.name == "arca.commit" and "commit failed" in r.getMessage()]
    recoveries = [r for r in caplog.records if "commits succeed again" in r.getMessage()]
    assert len(failures) == 1 and len(recoveries) == 1
    assert not failures[0].exc_info  # no traceback for a full disk


def test_replies_stalled_too_long_close_their_connection(arca, monkeypatch):
    monkeypatch.setattr(commit_module, "COMMIT_RETRY_SECONDS", 0.05)
    monkeypatch.setattr(commit_module, "STALLED_REPLY_SECONDS", 0.3)
    arca.archive.commit = FlakyDisk(arca.archive)
    with arca.connect() as writer:
        writer.sendall(b"SET k v\r\n")
        writer.settimeout(5)
        try:
            assert writer.recv(64) == b""  # closed, never told +OK
        except ConnectionResetError:
            pass


def test_acknowledged_writes_are_committed_in_groups(arca):
    commits_before = arca.state.stats.commits
    with arca.connect() as sock:
        sock.sendall(b"SET a 1\r\n")
        assert recv_exactly(sock, b"+OK\r\n") == b"+OK\r\n"
        assert arca.call(lambda: arca.archive.pending_writes) == 0  # committed before the ack
        burst = b"".join(b"SET k%d v\r\n" % i for i in range(200))
        sock.sendall(burst)
        assert recv_exactly(sock, b"+OK\r\n" * 200) == b"+OK\r\n" * 200
        assert arca.call(lambda: arca.archive.pending_writes) == 0
    commits = arca.state.stats.commits - commits_before
    assert 2 <= commits < 20  # one per event-loop tick, not one per write


def test_everysec_acknowledges_first_and_commits_within_a_second_or_two(arca_factory):
    server = arca_factory(durability="everysec")
    with server.connect() as sock:
        sock.sendall(b"SET a 1\r\n")
        assert recv_exactly(sock, b"+OK\r\n") == b"+OK\r\n"
    deadline = time.monotonic() + 5
    while server.call(lambda: server.archive.pending_writes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.call(lambda: server.archive.pending_writes) == 0
    assert server.state.stats.commits >= 1
