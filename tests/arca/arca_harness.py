"""ARCA test harness: a real ARCA server on 127.0.0.1 (port chosen by the OS) over a real archive.

The server runs in-process on its own thread and event loop, exactly as the daemon runs it
(same ArcaServer, same Archive), so tests can also look at the archive and server state.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import replace
from pathlib import Path

from arca.archive import Archive, ArchiveConfig
from arca.server import ArcaServer
from arca.state import ServerOptions


class ServerThread:
    """An ArcaServer serving on a background thread until stop()."""

    def __init__(self, directory: Path, options: ServerOptions, max_bytes: int = 64 << 20) -> None:
        self.archive = Archive(
            ArchiveConfig(directory=directory, max_bytes=max_bytes, durability=options.durability)
        )
        self.server = ArcaServer(self.archive, replace(options, max_bytes=max_bytes))
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.host, self.port = self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="arca-test-server", daemon=True)
        self.thread.start()
        if not started.wait(10):
            raise RuntimeError("ARCA test server did not start")

    @property
    def state(self):
        return self.server.state

    def call(self, fn, *args):
        """Run fn(*args) on the server's loop thread (the archive is single-threaded)."""
        done: dict = {}
        event = threading.Event()

        def work() -> None:
            try:
                done["value"] = fn(*args)
            except BaseException as exc:  # re-raised in the test thread
                done["error"] = exc
            event.set()

        self.loop.call_soon_threadsafe(work)
        event.wait(10)
        if "error" in done:
            raise done["error"]
        return done.get("value")

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=5)
        return sock

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.server.close(), self.loop)
        future.result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.archive.close()
        self.loop.close()


def start_server(tmp_path: Path, **options) -> ServerThread:
    max_bytes = options.pop("max_bytes", 64 << 20)
    return ServerThread(tmp_path / "arca", ServerOptions(host="127.0.0.1", port=0, **options), max_bytes)


def run(ctx, *argv):
    """dispatch() with str or bytes arguments; a reply computed in slices is run to its end."""
    from arca.commands import dispatch
    from arca.commands.registry import finish

    return finish(dispatch(ctx, [a if isinstance(a, bytes) else str(a).encode() for a in argv]))


def recv_exactly(sock: socket.socket, expected: bytes) -> bytes:
    """Read until as many bytes as `expected` holds have arrived, or the server closed."""
    data = b""
    while len(data) < len(expected):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def is_closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (end of file or a reset within 5 s)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def exchange(server, request: bytes, expected: bytes) -> bytes:
    """Send request on a new connection; returns as many reply bytes as `expected` holds."""
    with server.connect() as sock:
        sock.sendall(request)
        return recv_exactly(sock, expected)
