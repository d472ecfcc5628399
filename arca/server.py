"""The RESP server: listen, accept, idle-time maintenance, close.

Connections (reading, pipelining, replies) are arca/connection.py's; the group commit that
holds replies until their writes commit, and retries a failed commit, is arca/commit.py's.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, Callable

from arca.commit import GroupCommit
from arca.connection import Connection
from arca.state import ServerOptions, ServerState
from arca.tls_stream import TLSStream

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0
# How often the server looks for idle time: a period without any command lets the archive
# rewrite its L1 log in small steps (see arca/archive/entry_log.py).
IDLE_CHECK_SECONDS = 0.1


class ArcaServer:
    """The listening sockets, the connection set, idle-time maintenance and the shutdown."""

    def __init__(self, archive: Any, options: ServerOptions) -> None:
        self.archive = archive
        self.options = options
        self.state = ServerState.from_options(options)
        self.connections: set[Connection] = set()
        self.stopping = False
        self.shutdown_requested = asyncio.Event()  # set by the SHUTDOWN command
        self.state.request_shutdown = self.shutdown_requested.set
        self.commits = GroupCommit(archive, options, self.state)
        self.loop: asyncio.AbstractEventLoop  # the running loop, from start() on
        self._servers: list[asyncio.base_events.Server] = []
        self._idle_timer: asyncio.TimerHandle | None = None
        self._seen_commands = -1

    async def start(self) -> tuple[str, int]:
        """Bind and start accepting (the plain port unless it is -1, the TLS port when set);
        returns the address really bound (the plain one, else the TLS one)."""
        self.loop = asyncio.get_running_loop()
        options = self.options
        bound: list[tuple[str, int]] = []
        listeners: list[tuple[int, ssl.SSLContext | None]] = [(options.port, None)] if options.port >= 0 else []
        if options.tls_port:
            if options.tls_context is None:
                raise ValueError("tls_port needs a tls_context")
            listeners.append((options.tls_port, options.tls_context))
        try:
            for port, context in listeners:
                factory: Callable[[], asyncio.Protocol] = lambda: Connection(self)  # noqa: E731
                if context is not None:
                    factory = self._tls_factory(context)
                server = await self.loop.create_server(factory, options.host, port, reuse_address=True, backlog=511)
                self._servers.append(server)
                bound.append(server.sockets[0].getsockname()[:2])
        except BaseException:
            for server in self._servers:
                server.close()
            raise
        if options.port >= 0:
            self.state.tcp_port = bound[0][1]
        if options.tls_port:
            self.state.tls_port = bound[-1][1]
        host, port = bound[0]
        self.commits.start(self.loop)
        self._idle_timer = self.loop.call_later(IDLE_CHECK_SECONDS, self._idle_check)
        return host, port

    def _tls_factory(self, context: ssl.SSLContext) -> Callable[[], asyncio.Protocol]:
        """TLS done by arca/tls_stream.py (not the loop's), so a refused handshake sends its
        alert; each refusal is counted for INFO and logged (throttled) with the peer."""
        stats = self.state.stats

        def refused(peer: str, reason: str, error: ssl.SSLError | None) -> None:
            if isinstance(error, ssl.SSLCertVerificationError):
                stats.tls_cert_rejected += 1
            unlogged = stats.tls_failures.count(time.monotonic())
            if unlogged:
                log.warning("TLS connection from %s refused: %s (%d refusal(s) since the last such line, "
                            "%d since start)", peer, reason, unlogged, stats.tls_failures.total)

        return lambda: TLSStream(context, lambda: Connection(self), refused)

    # -- idle-time maintenance

    def _idle_check(self) -> None:
        self.state.stats.sample_ops(time.monotonic())
        processed = self.state.stats.commands_processed
        idle = processed == self._seen_commands
        self._seen_commands = processed
        if idle and self.state.persistence_error is None and self.archive.maintenance_due():
            self._maintain_while_idle()
        if not self.stopping:
            self._idle_timer = self.loop.call_later(IDLE_CHECK_SECONDS, self._idle_check)

    def _maintain_while_idle(self) -> None:
        """One step of archive maintenance (rewriting the L1 log, a few ms), then another
        after the loop has polled for input, for as long as no command arrives."""
        if self.stopping or self.state.stats.commands_processed != self._seen_commands:
            return
        try:
            more = self.archive.maintenance_step()
        except Exception:
            log.exception("archive maintenance failed; it is retried when the server is idle again")
            return
        if more:
            self.loop.call_soon(self._maintain_while_idle)

    # -- shutdown

    async def close(self) -> None:
        """Stop accepting, commit and answer what was in flight, close every connection."""
        if self.stopping:
            return
        self.stopping = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self.commits.stop()
        for server in self._servers:
            server.close()
        self.commits.commit_tick()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.closing = True
                conn.transport.close()
        deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self.commits.commit()
