"""Connection and server state that commands read and change (CLIENT, HELLO, AUTH, CONFIG, INFO).

The network layer (arca.server, arca.connection) owns the objects; commands see them through the
CommandContext. Nothing here touches a socket.
"""

from __future__ import annotations

import hmac
from secrets import token_hex
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeAlias

from arca.protocol import Limits

if TYPE_CHECKING:
    from arca.commands.registry import CommandSpec

# The commands queued since MULTI: each resolved spec with its argv.
Queued: TypeAlias = "list[tuple[CommandSpec, list[bytes]]]"


@dataclass(slots=True)
class ClientState:
    """One connection as commands see it."""

    id: int
    addr: str = ""
    laddr: str = ""
    loopback: bool = True  # connected from a loopback address (protected mode spares it)
    name: bytes = b""
    lib_name: bytes = b""
    lib_ver: bytes = b""
    resp: int = 2
    authenticated: bool = True
    created: float = field(default_factory=time.monotonic)
    last_command: bytes = b"NULL"
    last_active: float = field(default_factory=time.monotonic)
    close_after_reply: bool = False
    multi: Queued | None = None  # commands queued since MULTI, or None outside a transaction
    multi_failed: bool = False  # a command was refused while queueing: EXEC must abort
    watch: Any = None  # the archive's Watcher for this connection's WATCHed keys, or None
    # Set by the network layer: bytes buffered in and out, for CLIENT LIST.
    query_buffer: Callable[[], int] = lambda: 0
    output_buffer: Callable[[], int] = lambda: 0

    def end_transaction(self) -> Queued | None:
        queued, self.multi, self.multi_failed = self.multi, None, False
        return queued

    def info_line(self) -> str:
        """This client in CLIENT LIST / CLIENT INFO format."""
        now = time.monotonic()
        name = self.name.decode("utf-8", "replace")
        return (
            f"id={self.id} addr={self.addr} laddr={self.laddr} fd=-1 name={name} "
            f"age={int(now - self.created)} idle={int(now - self.last_active)} flags=N db=0 "
            f"sub=0 psub=0 ssub=0 multi={-1 if self.multi is None else len(self.multi)} qbuf={self.query_buffer()} qbuf-free=0 argv-mem=0 "
            f"multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem={self.output_buffer()} tot-mem=0 "
            f"events=r cmd={self.last_command.decode('utf-8', 'replace').lower()} user=default "
            f"redir=-1 resp={self.resp} lib-name={self.lib_name.decode('utf-8', 'replace')} "
            f"lib-ver={self.lib_ver.decode('utf-8', 'replace')}"
        )


# A kind of refusal is logged at most once per this many seconds (a client that guesses
# passwords or retries a bad certificate in a loop cannot flood the log).
REFUSALS_LOG_EVERY_S = 10.0


@dataclass(slots=True)
class Refusals:
    """A count of refusals of one kind, and how many the log has not mentioned yet."""

    total: int = 0
    unlogged: int = 0  # refusals since the last log line about them
    logged_at: float = float("-inf")  # monotonic time of that line

    def count(self, now: float) -> int:
        """Count one; the number to log now (this one and the unlogged before it), or 0 when
        the last line is less than REFUSALS_LOG_EVERY_S old."""
        self.total += 1
        self.unlogged += 1
        if now - self.logged_at < REFUSALS_LOG_EVERY_S:
            return 0
        unlogged, self.unlogged, self.logged_at = self.unlogged, 0, now
        return unlogged


@dataclass(slots=True)
class ServerStats:
    """Counters reported by INFO stats."""

    connections_received: int = 0
    rejected_connections: int = 0
    # AUTH / HELLO AUTH with a wrong user or password (INFO acl_access_denied_auth)
    auth_failures: "Refusals" = field(default_factory=lambda: Refusals())
    # TLS handshakes refused: a client certificate that does not verify, a protocol error,
    # no handshake in time (INFO tls_handshake_failures, tls_client_cert_rejected)
    tls_failures: "Refusals" = field(default_factory=lambda: Refusals())
    tls_cert_rejected: int = 0
    commands_processed: int = 0
    protocol_errors: int = 0
    commits: int = 0
    commit_seconds: float = 0.0
    # (monotonic time, commands_processed) every 100 ms over the last 1.6 s, as Redis samples
    # instantaneous_ops_per_sec.
    ops_samples: deque = field(default_factory=lambda: deque(maxlen=16))
    # INFO commandstats: command name ("get", "config|get") -> [calls, nanoseconds,
    # rejected calls, failed calls]; INFO errorstats: error prefix ("ERR") -> replies.
    commands: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    plain_base: tuple[int, ...] = ()  # the L1 table's plain_calls at the last CONFIG RESETSTAT

    def reset(self) -> None:
        """Every counter back to its start (CONFIG RESETSTAT): the fields' defaults again."""
        ServerStats.__init__(self)

    def command(self, name: str) -> list[int]:
        """The commandstats counters of one command, created at its first use."""
        counters = self.commands.get(name)
        if counters is None:
            counters = self.commands[name] = [0, 0, 0, 0]
        return counters

    def error(self, message: str) -> None:
        """One error reply, counted under its prefix (at most MAX_ERROR_PREFIXES of them,
        as Redis bounds errorstats)."""
        prefix = message.split(" ", 1)[0]
        if prefix in self.errors or len(self.errors) < self.MAX_ERROR_PREFIXES:
            self.errors[prefix] = self.errors.get(prefix, 0) + 1

    MAX_ERROR_PREFIXES: ClassVar[int] = 128

    def sample_ops(self, now: float) -> None:
        self.ops_samples.append((now, self.commands_processed))

    @property
    def ops_per_sec(self) -> int:
        """Commands per second over the sampled window (0 until two samples exist)."""
        if len(self.ops_samples) < 2:
            return 0
        (start, first), (end, last) = self.ops_samples[0], self.ops_samples[-1]
        return round((last - first) / (end - start)) if end > start else 0


@dataclass(slots=True)
class SlowLog:
    """SLOWLOG: the most recent commands that ran longer than `log_slower_than_us`.

    `log_slower_than_us` < 0 logs nothing, 0 logs every command (slowlog-log-slower-than);
    at most `max_len` entries are kept, newest first (slowlog-max-len).
    """

    log_slower_than_us: int = 10000
    max_len: int = 128
    entries: deque = field(default_factory=deque)
    next_id: int = 0

    MAX_ARGS: ClassVar[int] = 32
    MAX_ARG_BYTES: ClassVar[int] = 128

    def record(self, argv: list[bytes], duration_us: int, client: ClientState) -> None:
        """Log one command: passwords redacted, long argument lists and long arguments cut
        as Redis cuts them."""
        argv = _redacted(argv)
        shown = argv if len(argv) <= self.MAX_ARGS else argv[: self.MAX_ARGS - 1]
        args = [a if len(a) <= self.MAX_ARG_BYTES else
                a[: self.MAX_ARG_BYTES] + b"... (%d more bytes)" % (len(a) - self.MAX_ARG_BYTES) for a in shown]
        if len(argv) > self.MAX_ARGS:
            args.append(b"... (%d more arguments)" % (len(argv) - self.MAX_ARGS + 1))
        entry = (self.next_id, int(time.time()), duration_us, args, client.addr.encode(), client.name)
        self.next_id += 1
        self.entries.appendleft(entry)
        self.trim()

    def trim(self) -> None:
        while len(self.entries) > self.max_len:
            self.entries.pop()

    @property
    def times_each_command(self) -> bool:
        """Whether every command must be timed on its own (the plain path in C times none)."""
        return 0 <= self.log_slower_than_us < PLAIN_PATH_SLOWLOG_FLOOR_US


REDACTED = b"(redacted)"


def _redacted(argv: list[bytes]) -> list[bytes]:
    """argv with its secrets replaced as Redis replaces them in SLOWLOG: every AUTH argument,
    the user and password after HELLO's AUTH, the value of CONFIG SET requirepass."""
    name = argv[0].upper()
    if name == b"AUTH":
        return [argv[0]] + [REDACTED] * (len(argv) - 1)
    secrets: set[int] = set()
    if name == b"HELLO":
        for i, arg in enumerate(argv):
            if arg.upper() == b"AUTH":
                secrets.update((i + 1, i + 2))
    elif name == b"CONFIG" and len(argv) > 1 and argv[1].upper() == b"SET":
        secrets.update(i + 1 for i in range(2, len(argv), 2) if argv[i].lower() == b"requirepass")
    if not secrets:
        return argv
    return [REDACTED if i in secrets else arg for i, arg in enumerate(argv)]


# Below this slowlog-log-slower-than, the server sends every command through dispatch, which
# times each one; the plain path (plain GET/SET/INCR/... answered in C, microseconds each)
# runs while the threshold is above it or logging is off.
PLAIN_PATH_SLOWLOG_FLOOR_US = 1000


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """The server's settings as configured at start (arca.config builds them)."""

    host: str = "127.0.0.1"
    port: int = 6420  # -1: no plain TCP listener
    tls_port: int = 0  # 0: no TLS listener
    tls_context: ssl.SSLContext | None = None  # arca.tls.server_context(...), for tls_port
    tls_require_client_cert: bool = True  # tls-auth-clients yes: no certificate, no service
    durability: str = "commit"  # "commit" | "fsync" | "everysec"
    limits: Limits = Limits()
    maxclients: int = 10000
    slowlog_log_slower_than: int = 10000
    slowlog_max_len: int = 128
    requirepass: str | None = None
    protected_mode: bool = True
    directory: str = ""
    max_bytes: int = 0
    config_file: str = ""


@dataclass(slots=True)
class ServerState:
    """Server-wide state: the options, what CONFIG SET may change, the client table, counters."""

    options: ServerOptions
    maxclients: int = 0
    requirepass: str | None = None
    started_monotonic: float = field(default_factory=time.monotonic)
    clients: dict[int, ClientState] = field(default_factory=dict)
    stats: ServerStats = field(default_factory=ServerStats)
    next_client_id: int = 1
    tcp_port: int = 0
    tls_port: int = 0
    slowlog: SlowLog = field(default_factory=SlowLog)
    replid: str = field(default_factory=lambda: token_hex(20))  # INFO replication's master_replid
    # Set by the server: asks it to shut down gracefully (SHUTDOWN); None where unsupported.
    request_shutdown: Callable[[], None] | None = None
    # Why the last commit failed (a full disk, say), while write commands are refused
    # (-MISCONF); None while commits succeed.
    persistence_error: str | None = None

    @classmethod
    def from_options(cls, options: ServerOptions) -> ServerState:
        return cls(options, maxclients=options.maxclients, requirepass=options.requirepass,
                   slowlog=SlowLog(options.slowlog_log_slower_than, options.slowlog_max_len))

    def new_client_id(self) -> int:
        client_id = self.next_client_id
        self.next_client_id += 1
        return client_id

    @property
    def plain_path_open(self) -> bool:
        """Whether plain commands may skip dispatch (the plain path in C, the server's GET/SET
        shortcut): commits succeed (writes are refused while they fail) and SLOWLOG does
        not need each command timed."""
        return self.persistence_error is None and not self.slowlog.times_each_command

    def refuses(self, client: ClientState) -> bool:
        """Protected mode: with no password set, only loopback clients are served (checked
        when a client connects and before an unauthenticated client's commands, so a
        password removed at run time does not open the server to everyone)."""
        return self.options.protected_mode and self.requirepass is None and not client.loopback

    def password_matches(self, candidate: bytes) -> bool:
        """Constant-time comparison with the configured password."""
        if self.requirepass is None:
            return False
        return hmac.compare_digest(candidate, self.requirepass.encode("utf-8"))

    @property
    def uptime_seconds(self) -> int:
        return int(time.monotonic() - self.started_monotonic)
