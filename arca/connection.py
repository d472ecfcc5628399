"""One client connection: reading, the plain path, pipelining, replies.

Each connection is an `asyncio.Protocol` (no streams): a read is decoded into every
complete command it holds, the commands run in order, and their replies leave in one write.
A read that starts with plain commands (GET, SET key value, MGET, MSET, INCR and the like,
PING) is first served by the archive's L1 table straight from the bytes (`run_plain`).

While the archive holds uncommitted writes, a batch's replies are handed to the server's
group commit (arca/commit.py) instead of being written, and leave once the writes before
them have committed. A connection sees the server that accepted it only through `Server`
below (arca/server.py's ArcaServer is the one there is).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol, cast

from arca.commands import dispatch
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
# A batch of pipelined commands stops producing replies past this many bulk bytes and goes
# on when the client has read them, so one read cannot make the server buffer gigabytes.
OUTPUT_BATCH_BYTES = 4 * 1024 * 1024


class Replies(Protocol):
    """Where a batch's replies go when they may not leave at once: the group commit."""

    hold_replies: bool  # replies wait for the commit of the writes before them (not everysec)
    pending_queues: tuple  # the archive's queues of uncommitted writes: any() means a commit is due

    def deliver(self, conn: Connection, out: list[bytes]) -> None:
        """Send out now, or hold it (and what follows) until the next commit."""


class Server(Protocol):
    """What a connection needs from the server that accepted it."""

    archive: Any  # what commands run against (dispatch's context), and the plain path
    options: ServerOptions  # limits, TLS client certificates
    state: ServerState  # clients, authentication, stats, the plain path's switch
    loop: asyncio.AbstractEventLoop
    stopping: bool  # shutting down: a new connection is refused
    connections: set[Connection]  # open connections, for the shutdown

    @property
    def commits(self) -> Replies: ...


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

    __slots__ = ("server", "commits", "transport", "decoder", "client", "ctx", "held", "closing", "backlog", "slow",
                 "write_paused", "reading_paused", "eof", "strict_limits", "run_plain", "max_bulk", "max_items")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.commits = server.commits
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
        commits = self.commits
        if self.held is None and not (commits.hold_replies and any(commits.pending_queues)):
            # The common case: nothing to wait for, one write for the whole batch.
            if out:
                transport = self.transport
                assert transport is not None  # set until connection_lost, after which nothing is read
                transport.write(out[0] if len(out) == 1 else b"".join(out))
        else:
            commits.deliver(self, out)

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
        self.commits.deliver(self, out)
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
