"""The RESP server: connections, pipelining, group commit, authentication, limits, shutdown.

Each connection is an `asyncio.Protocol` (no streams): a read is decoded into every
complete command it holds, the commands run in order, and their replies leave in one write.

Group commit. Commands apply writes to the archive at once; a write becomes durable at the
archive's next `commit()`. While the archive holds uncommitted writes, a connection's
replies are held back; once per event-loop tick (after every read of that tick has been
processed) the server commits once and only then releases the held replies. So every
acknowledged write is committed, and N concurrent writers cost one transaction, not N. In
`everysec` durability replies leave at once and a timer commits once a second.

A commit that fails (a full disk) is logged once, and the server then refuses write
commands with -MISCONF, answers reads at once (they are no longer held) and retries the
commit every second; the connections whose replies waited for the failed commit keep
waiting for a retry that succeeds (then get their replies) or are closed after
STALLED_REPLY_SECONDS, never told that a write which did not commit succeeded. The first
successful retry is logged once and everything returns to normal.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, cast

from arca.commands import dispatch
from arca.archive.errors import ArchiveError
from arca.commands.registry import DENIED, CommandContext, Incremental
from arca.config import is_loopback
from arca.protocol import OK, UNAUTHENTICATED, Decoder, encode, encode_error
from arca.state import ClientState, ServerOptions, ServerState
from arca.tls import NO_CLIENT_CERT

log = logging.getLogger(__name__)

_OK_BYTES = b"+OK\r\n"
MAX_CLIENTS_REPLY = b"-ERR max number of clients reached\r\n"
DENIED_REPLY = encode_error(DENIED)
NO_CLIENT_CERT_REPLY = encode_error(NO_CLIENT_CERT)
SHUTDOWN_GRACE_SECONDS = 5.0
# How often the server looks for idle time: a period without any command lets the archive
# rewrite its L1 log in small steps (see arca/archive/entry_log.py).
IDLE_CHECK_SECONDS = 0.1
# A batch of pipelined commands stops producing replies past this many bulk bytes and goes
# on when the client has read them, so one read cannot make the server buffer gigabytes.
OUTPUT_BATCH_BYTES = 4 * 1024 * 1024
# While commits fail: how often one is retried, and how long replies that wait for the
# failed commit are held before their connection is closed instead.
COMMIT_RETRY_SECONDS = 1.0
STALLED_REPLY_SECONDS = 10.0


_GET_NAMES = frozenset((b"GET", b"get"))
_SET_NAMES = frozenset((b"SET", b"set"))


def _fast_set(put: Any, argv: list[bytes]) -> bool:
    """SET key value; False when the archive refuses it (dispatch then reports the error)."""
    try:
        put(argv[1], argv[2])
    except Exception:
        return False
    return True


def _encode_safely(reply: object, resp: int, argv: list[bytes]) -> bytes:
    """encode(), but a command returning a value RESP cannot carry answers an error, not a crash."""
    try:
        return encode(reply, resp)
    except TypeError:
        log.exception("command %r returned an unencodable reply", argv[0])
        return encode_error("ERR internal error: the command produced an invalid reply; see the server log")


def _nothing_buffered() -> int:
    return 0


class Connection(asyncio.Protocol):
    """One client: decode, dispatch, encode, and hold replies until their writes commit."""

    __slots__ = ("server", "transport", "decoder", "client", "ctx", "held", "closing", "backlog", "slow",
                 "write_paused", "reading_paused", "eof", "strict_limits", "run_plain", "max_bulk", "max_items")

    def __init__(self, server: ArcaServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.strict_limits = server.state.requirepass is not None  # until the client authenticates
        self.decoder = Decoder(UNAUTHENTICATED if self.strict_limits else server.options.limits)
        self.held: list[bytes] | None = None  # replies waiting for the tick's commit
        self.closing = False
        self.backlog: list[list[bytes]] | None = None  # commands left over by a huge batch
        self.slow: Incremental | None = None  # a reply computed in slices (KEYS), the backlog waits for it
        self.write_paused = False  # the transport's buffer is above its high-water mark
        self.reading_paused = False
        self.eof = False  # the client half-closed: close once everything is answered
        self.run_plain = server.archive.run_plain
        self.max_bulk = server.options.limits.max_bulk_len
        self.max_items = server.options.limits.max_multibulk_len

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        state = server.state
        # The loop gives a stream protocol a Transport (write, pause_reading, ...).
        self.transport = transport = cast(asyncio.Transport, transport)
        state.stats.connections_received += 1
        if len(state.clients) >= state.maxclients or server.stopping:
            state.stats.rejected_connections += 1
            transport.write(MAX_CLIENTS_REPLY)
            transport.close()
            self.client = None
            self.closing = True
            return
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.client = ClientState(
            id=state.new_client_id(),
            addr=f"{peer[0]}:{peer[1]}",
            laddr=f"{local[0]}:{local[1]}",
            loopback=is_loopback(str(peer[0])),
            authenticated=state.requirepass is None,
            query_buffer=lambda: self.decoder.buffered,
            output_buffer=lambda: self.transport.get_write_buffer_size() if self.transport else 0,
        )
        if self._lacks_client_cert(transport):
            log.info("client %s: TLS without a client certificate refused (tls-auth-clients yes)", self.client.addr)
            transport.write(NO_CLIENT_CERT_REPLY)
            transport.close()
            self.client = None
            self.closing = True
            return
        if state.refuses(self.client):
            transport.write(DENIED_REPLY)
            transport.close()
            self.client = None
            self.closing = True
            return
        self.ctx = CommandContext(server.archive, self.client, state)
        state.clients[self.client.id] = self.client
        server.connections.add(self)

    def _lacks_client_cert(self, transport: asyncio.Transport) -> bool:
        options = self.server.options
        return (options.tls_require_client_cert and transport.get_extra_info("sslcontext") is not None
                and not transport.get_extra_info("peercert"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client is not None:
            if self.client.watch is not None:
                self.server.archive.unwatch(self.client.watch)
            self.server.state.clients.pop(self.client.id, None)
            self.server.connections.discard(self)
            # Nothing may keep this connection alive past its close: the client's buffer
            # gauges are closures over it (a reference cycle the cyclic collector would
            # free only when it next runs, with a half-received bulk of up to
            # proto-max-bulk-len inside). Break them and drop every buffer now.
            self.client.query_buffer = self.client.output_buffer = _nothing_buffered
        if self.slow is not None:
            self.slow.cancel()
        self.decoder.discard()
        self.transport = self.slow = self.backlog = self.held = None

    def eof_received(self) -> bool:
        # The client finished sending (half-close): answer what it sent, then close.
        self.eof = True
        if self.backlog is None:
            self._close_when_answered()
        return True

    def _close_when_answered(self) -> None:
        self.closing = True
        if self.held is None and self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        # The client is not reading its replies: stop reading its commands until it does.
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.backlog is not None:
            self.server.loop.call_soon(self._continue)
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        client = self.ctx.client  # = self.client, set here: only a refused connection has none, and it is closing
        if (client.multi is None and client.authenticated and not self.strict_limits
                and self.backlog is None and self.decoder.idle and self.ctx.server.plain_path_open):
            # The plain path: the read's leading plain commands (GET, SET key value, MGET,
            # MSET, INCR and the like, PING) run in the archive's L1 table straight from the
            # bytes (no argv lists, no dispatch).
            reply, consumed, count, last = self.run_plain(data, client.resp, OUTPUT_BATCH_BYTES, self.max_bulk,
                                                          self.max_items)
            if count:
                client.last_command = last
                client.last_active = time.monotonic()
                self.server.state.stats.commands_processed += count
                if consumed == len(data):
                    self._reply([reply])
                elif len(reply) > OUTPUT_BATCH_BYTES:  # the rest waits until the client reads
                    self.backlog = self.decoder.feed(data[consumed:]) or None
                    self._finish_unusual([reply])
                else:
                    self._execute(self.decoder.feed(data[consumed:]), [reply])
                return
        self._execute(self.decoder.feed(data), [])

    def _execute(self, commands: list[list[bytes]], out: list[bytes]) -> None:
        """Run commands in order after the replies already in `out`; stop after
        OUTPUT_BATCH_BYTES of bulk replies (backlog)."""
        ctx = self.ctx
        client = ctx.client
        # GET key and SET key value skip the generic dispatch (spec lookup, arity, handler
        # frame) while nothing else applies: not queueing for MULTI, authenticated, commits
        # succeeding, SLOWLOG not timing each command. Only a dispatched command can change
        # that, so it is read again after each one.
        plain = client.multi is None and client.authenticated and ctx.server.plain_path_open
        done = self._run_each(commands, out, plain) if commands else 0
        if done:
            client.last_command = commands[done - 1][0]
            client.last_active = time.monotonic()
            ctx.server.stats.commands_processed += done
        self._reply(out)

    def _reply(self, out: list[bytes]) -> None:
        """Send the replies of a batch now, or hold them until the tick's commit."""
        if self.strict_limits or self.backlog is not None or self.decoder.error is not None or self.closing:
            self._finish_unusual(out)
            return
        server = self.server
        if self.held is None and not (server.hold_replies and any(server.pending_queues)):
            # The common case: nothing to wait for, one write for the whole batch.
            if out:
                transport = self.transport
                assert transport is not None  # set until connection_lost, after which nothing is read
                transport.write(out[0] if len(out) == 1 else b"".join(out))
        else:
            server.deliver(self, out)

    def _run_each(self, commands: list[list[bytes]], out: list[bytes], plain: bool) -> int:
        """Run commands one by one, appending replies to out; returns how many ran."""
        append = out.append
        ctx = self.ctx
        client = ctx.client
        get = ctx.archive.get
        put = ctx.archive.put
        get_names, set_names, ok, ok_bytes = _GET_NAMES, _SET_NAMES, OK, _OK_BYTES
        total = len(commands)
        produced = done = gets = sets = 0
        for argv in commands:
            done += 1
            name = argv[0]
            if plain and name in get_names and len(argv) == 2:
                reply = get(argv[1])
                gets += 1
            elif plain and name in set_names and len(argv) == 3 and _fast_set(put, argv):
                append(ok_bytes)
                sets += 1
                continue
            else:
                reply = dispatch(ctx, argv)
                plain = client.multi is None and client.authenticated and ctx.server.plain_path_open
                if type(reply) is Incremental:
                    if not reply.step():  # more than one slice: the rest runs between other clients
                        self.slow = reply
                        self.backlog = commands[done:]
                        break
                    reply = reply.value
            kind = type(reply)
            if kind is bytes:
                append(b"$%d\r\n%b\r\n" % (len(reply), reply))
                produced += len(reply)
            elif reply is ok:
                append(ok_bytes)
            else:
                append(_encode_safely(reply, client.resp, argv))
            if client.close_after_reply:
                self.closing = True
                break
            if produced > OUTPUT_BATCH_BYTES and done < total:
                self.backlog = commands[done:]
                break
        if gets or sets:  # the shortcut's calls in commandstats (untimed, as the plain path's)
            stats = ctx.server.stats
            stats.command("get")[0] += gets
            stats.command("set")[0] += sets
        return done

    def _finish_unusual(self, out: list[bytes]) -> None:
        """The end of a batch that authenticated, hit a protocol error, must close or was cut short."""
        client = self.ctx.client
        if self.strict_limits and client.authenticated:
            self.strict_limits = False
            self.decoder.set_limits(self.server.options.limits)
        if self.backlog is None and self.decoder.error is not None and not self.closing:
            self.server.state.stats.protocol_errors += 1
            log.debug("client %d: protocol error: %s", client.id, self.decoder.error)
            out.append(encode_error(f"ERR Protocol error: {self.decoder.error}"))
            self.closing = True
        self.server.deliver(self, out)
        if self.backlog is not None:
            self._update_reading()
            if not self.write_paused:
                self.server.loop.call_soon(self._continue)

    def _continue(self) -> None:
        """Run the rest of a batch cut short by its output size (once the client reads) or
        by a reply computed in slices (one slice per event-loop turn until it is ready)."""
        if self.backlog is None or self.write_paused or self.transport is None:
            return
        out: list[bytes] = []
        slow = self.slow
        if slow is not None:
            if not slow.step():
                self.server.loop.call_soon(self._continue)
                return
            self.slow = None
            out.append(_encode_safely(slow.value, self.ctx.client.resp, [slow.spec.name.encode()]))
        commands, self.backlog = self.backlog, None
        self._execute(commands, out)
        if self.backlog is None and self.eof and not self.closing:
            self._close_when_answered()
        self._update_reading()

    def _update_reading(self) -> None:
        """Read from the client unless its replies are piling up (in the socket or the backlog)."""
        transport = self.transport
        if transport is None or self.closing:
            return
        should_pause = self.write_paused or self.backlog is not None
        if should_pause != self.reading_paused:
            self.reading_paused = should_pause
            if should_pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    # -- called by the server

    def send(self, out: list[bytes]) -> None:
        transport = self.transport
        if transport is None:
            return
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        if self.closing:
            transport.close()

    def release(self) -> None:
        """The tick's commit is done: send the replies held for it."""
        held, self.held = self.held, None
        if held is not None:
            self.send(held)


class ArcaServer:
    """The listening socket, the connection set, the commit schedule."""

    def __init__(self, archive: Any, options: ServerOptions) -> None:
        self.archive = archive
        self.options = options
        self.state = ServerState.from_options(options)
        self.connections: set[Connection] = set()
        self.stopping = False
        self.shutdown_requested = asyncio.Event()  # set by the SHUTDOWN command
        self.state.request_shutdown = self.shutdown_requested.set
        # In commit and fsync modes replies wait for the commit of the writes before them.
        self.hold_replies = options.durability != "everysec"
        self.pending_queues = archive.pending_queues
        self._waiting: list[Connection] = []
        # While commits fail: connections whose replies wait for a retry, and until when.
        self._stalled: list[tuple[Connection, float]] = []
        self._retry_timer: asyncio.TimerHandle | None = None
        self._commit_scheduled = False
        self.loop: asyncio.AbstractEventLoop  # the running loop, from start() on
        self._servers: list[asyncio.base_events.Server] = []
        self._timer: asyncio.TimerHandle | None = None
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
                server = await self.loop.create_server(
                    lambda: Connection(self), options.host, port, reuse_address=True, backlog=511, ssl=context,
                    ssl_handshake_timeout=10.0 if context is not None else None)
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
        if not self.hold_replies:
            self._timer = self.loop.call_later(1.0, self._every_second)
        self._idle_timer = self.loop.call_later(IDLE_CHECK_SECONDS, self._idle_check)
        return host, port

    # -- replies and group commit

    def deliver(self, conn: Connection, out: list[bytes]) -> None:
        if conn.held is not None:
            conn.held += out
        elif self.hold_replies and any(self.pending_queues):
            conn.held = out
            self._waiting.append(conn)
            if not self._commit_scheduled:
                self._commit_scheduled = True
                self.loop.call_soon(self._commit_tick)
        else:
            conn.send(out)

    def _commit(self) -> bool:
        if not self.archive.pending_writes:
            self._commits_work()
            return True
        started = time.perf_counter()
        try:
            self.archive.commit()
        except Exception as error:
            self._commits_fail(error)
            return False
        stats = self.state.stats
        stats.commits += 1
        stats.commit_seconds += time.perf_counter() - started
        self._commits_work()
        return True

    def _commits_fail(self, error: Exception) -> None:
        """Refuse writes, serve reads, retry: see the module docstring."""
        state = self.state
        if state.persistence_error is None:
            log.error("commit failed: %s. Write commands are refused (-MISCONF) and the commit is "
                      "retried every %g s; reads are served meanwhile", error, COMMIT_RETRY_SECONDS,
                      exc_info=not isinstance(error, ArchiveError))
            state.persistence_error = str(error)
            self.hold_replies = False  # nothing new to commit: reads are answered at once
        if self._retry_timer is None and not self.stopping:
            self._retry_timer = self.loop.call_later(COMMIT_RETRY_SECONDS, self._retry_commit)

    def _commits_work(self) -> None:
        state = self.state
        if state.persistence_error is not None:
            log.warning("commits succeed again: write commands are accepted")
            state.persistence_error = None
            self.hold_replies = self.options.durability != "everysec"
        if self._stalled:
            stalled, self._stalled = self._stalled, []
            for conn, _ in stalled:
                conn.release()

    def _retry_commit(self) -> None:
        self._retry_timer = None
        if self._commit() or self.stopping:
            return
        now = time.monotonic()
        keep = []
        for conn, deadline in self._stalled:
            if now < deadline:
                keep.append((conn, deadline))
            elif conn.transport is not None:
                conn.held = None
                conn.transport.abort()  # never acknowledge a write that did not commit
        self._stalled = keep

    def _commit_tick(self) -> None:
        self._commit_scheduled = False
        committed = self._commit()
        waiting, self._waiting = self._waiting, []
        if committed:
            for conn in waiting:
                conn.release()
            return
        # Their replies may acknowledge writes of the failed commit: they wait for a retry.
        deadline = time.monotonic() + STALLED_REPLY_SECONDS
        self._stalled += [(conn, deadline) for conn in waiting if conn.transport is not None]

    def _every_second(self) -> None:
        self._commit()
        if not self.stopping:
            self._timer = self.loop.call_later(1.0, self._every_second)

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
        for timer in (self._timer, self._idle_timer, self._retry_timer):
            if timer is not None:
                timer.cancel()
        for server in self._servers:
            server.close()
        self._commit_tick()
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
        self._commit()
