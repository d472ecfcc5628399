"""A closed connection frees its buffers at once, not when the cyclic collector next runs.

A client that sends a large bulk header, part of the body, then closes leaves a buffer of
up to proto-max-bulk-len in its connection; rounds of such clients grew the daemon's RSS by
gigabytes while reference cycles kept closed connections alive. Here the collector is
switched off, so only reference counting can free them.
"""

from __future__ import annotations

import gc
import time

from arca.connection import Connection

BULK_HEADER = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (48 << 20)


def _connections_of(server) -> list[Connection]:
    return [obj for obj in gc.get_objects() if type(obj) is Connection and obj.server is server]


def _wait_closed(arca, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while arca.server.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not arca.server.connections


def _wait_freed(arca, timeout: float = 2.0) -> int:
    """The server's Connection objects still alive, polled on the loop until none is or the
    timeout: a callback the loop had already queued for the connection (the next slice of a
    KEYS) holds it until the loop runs it. The collector is off, so none is freed by it: a
    connection kept by a reference cycle stays, and the count with it."""
    deadline = time.monotonic() + timeout
    while True:
        alive = arca.call(lambda: len(_connections_of(arca.server)))
        if alive == 0 or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def test_abandoned_large_bulks_leave_nothing_alive(arca):
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            sockets = [arca.connect() for _ in range(5)]
            for sock in sockets:
                sock.sendall(BULK_HEADER + b"x" * (4 << 20))
            deadline = time.monotonic() + 10
            while (sum(conn.decoder.buffered for conn in list(arca.server.connections)) < 5 * (4 << 20)
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            for sock in sockets:
                sock.close()
            _wait_closed(arca)
            # No reference cycle holds a closed connection (or its half-received bulk).
            assert _wait_freed(arca) == 0
    finally:
        gc.enable()


def test_a_connection_closed_mid_keys_drops_its_work(arca):
    arca.call(lambda: [arca.archive.put(b"k%d" % i, b"v") for i in range(50_000)])
    gc.collect()
    gc.disable()
    try:
        with arca.connect() as sock:
            sock.sendall(b"KEYS *x*\r\n" + BULK_HEADER + b"y" * (1 << 20))
        _wait_closed(arca)
        assert _wait_freed(arca) == 0
    finally:
        gc.enable()
