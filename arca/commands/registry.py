"""The command table: `@command` registers a function with its spec; `dispatch` runs one argv.

A command is a plain function `(ctx, argv) -> reply value` (see arca.protocol.encode for the
value types) that never touches a socket. Dispatch does what every command shares, with
Redis's exact error strings: lookup (case-insensitive), subcommands (`CLIENT|SETNAME`),
arity, authentication, commands refused inside MULTI (flag `no_multi`), timing for SLOWLOG,
and turning errors into error replies in this one place. COMMAND COUNT/DOCS/INFO/LIST are
generated from the specs registered here.

A command whose work grows with the keyspace (KEYS) returns an `Incremental`: a reply
computed in slices of bounded work. The server runs one slice at a time and serves other
clients in between; EXEC and direct callers run it to the end with `finish`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Callable, Generator

from arca.archive.config import ENTRY_OVERHEAD
from arca.archive.errors import ArchiveError, ArchiveOOMError
from arca.protocol import ErrorReply, Status
from arca.state import ClientState, ServerState

__all__ = [
    "CommandContext",
    "CommandError",
    "CommandSpec",
    "ErrorReply",
    "Status",
    "all_specs",
    "call",
    "command",
    "dispatch",
    "finish",
    "fits_budget",
    "Incremental",
    "key_positions",
    "lookup",
]

log = logging.getLogger(__name__)

Reply = Any
Handler = Callable[["CommandContext", list[bytes]], Reply]

NOAUTH = ErrorReply("NOAUTH Authentication required.")
DENIED = ErrorReply(
    "DENIED protected mode: no password is set, so only clients on a loopback address are "
    "served. Set one (CONFIG SET requirepass, from the server's own host), or restart with "
    "--protected-mode no if a firewall already guards the port")
MISCONF = ErrorReply(
    "MISCONF the archive cannot commit to disk (see the server log: a full disk?), so write "
    "commands are refused until a commit succeeds again; reads are served")
OOM = "OOM command not allowed when used memory > 'maxmemory'."


class CommandError(Exception):
    """A command refused its input; the message starts with the error prefix (ERR, WRONGTYPE...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a command may use: the archive, its own connection, the server's state."""

    archive: Any  # arca.archive.Archive (typed loosely: the server side must not need it)
    client: ClientState
    server: ServerState


@dataclass(slots=True)
class CommandSpec:
    """A registered command; fields mirror what COMMAND INFO/DOCS report."""

    name: str  # full name, upper case: "GET", "CLIENT|SETNAME"
    handler: Handler | None
    arity: int
    flags: tuple[str, ...] = ()
    group: str = "generic"
    summary: str = ""
    args: str = ""
    since: str = "1.0.0"
    keys: tuple[int, int, int] = (0, 0, 0)  # first key, last key, step
    subcommands: dict[bytes, CommandSpec] = field(default_factory=dict)
    writes: bool = False  # flagged "write": refused while commits fail

    def __post_init__(self) -> None:
        self.writes = "write" in self.flags

    @property
    def fullname(self) -> str:
        return self.name.lower()

    @property
    def no_auth(self) -> bool:
        return "no_auth" in self.flags


_TABLE: dict[bytes, CommandSpec] = {}  # static: filled at import time by @command


def command(
    name: str,
    arity: int,
    flags: tuple[str, ...] = (),
    group: str = "generic",
    summary: str = "",
    args: str = "",
    since: str = "1.0.0",
    keys: tuple[int, int, int] = (0, 0, 0),
) -> Callable[[Handler], Handler]:
    """Register a command (or `PARENT|SUB` subcommand) under `name`."""

    def register(handler: Handler) -> Handler:
        spec = CommandSpec(name.upper(), handler, arity, tuple(flags), group, summary, args, since, keys)
        parent_name, _, sub = spec.name.partition("|")
        if sub:
            parent = _TABLE.get(parent_name.lower().encode())
            if parent is None:
                parent = CommandSpec(parent_name, None, -2, (), group, f"{parent_name} subcommands")
                _register(parent)
            parent.subcommands[sub.lower().encode()] = spec
        else:
            existing = _TABLE.get(spec.name.lower().encode())
            if existing is not None:
                spec.subcommands = existing.subcommands
            _register(spec)
        return handler

    return register


def _register(spec: CommandSpec) -> None:
    _TABLE[spec.name.lower().encode()] = spec
    _TABLE[spec.name.upper().encode()] = spec


def lookup(name: bytes) -> CommandSpec | None:
    return _TABLE.get(name) or _TABLE.get(name.lower())


def all_specs() -> list[CommandSpec]:
    """Every top-level command once, sorted by name."""
    return sorted({id(s): s for s in _TABLE.values()}.values(), key=lambda s: s.name)


def _quoted_args(argv: list[bytes]) -> str:
    text = ""
    for arg in argv:
        if len(text) >= 128:
            break
        text += "'" + arg.decode("utf-8", "replace")[: 128 - len(text)] + "' "
    return text


def _unknown(argv: list[bytes]) -> ErrorReply:
    name = argv[0].decode("utf-8", "replace")[:128]
    return ErrorReply(f"ERR unknown command '{name}', with args beginning with: {_quoted_args(argv[1:])}")


def _arity_ok(arity: int, argc: int) -> bool:
    return argc == arity if arity > 0 else argc >= -arity


def _wrong_arity(spec: CommandSpec) -> ErrorReply:
    return ErrorReply(f"ERR wrong number of arguments for '{spec.fullname}' command")


def _subcommand(spec: CommandSpec, argv: list[bytes]) -> CommandSpec | ErrorReply:
    sub = spec.subcommands.get(argv[1].lower())
    if sub is not None:
        return sub
    if argv[1].lower() == b"help":
        return CommandSpec(f"{spec.name}|HELP", lambda ctx, _: _help(spec), 2)
    name = argv[1].decode("utf-8", "replace")[:128]
    return ErrorReply(f"ERR unknown subcommand '{name}'. Try {spec.name} HELP.")


def _help(spec: CommandSpec) -> list[bytes]:
    lines = [f"{spec.name} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"]
    for sub in sorted(spec.subcommands.values(), key=lambda s: s.name):
        lines.append(f"{sub.name.partition('|')[2]} {sub.args}".rstrip())
        lines.append(f"    {sub.summary}")
    lines += ["HELP", "    Print this help."]
    return [line.encode() for line in lines]


class Incremental:
    """A reply computed in slices: `steps` yields after each slice of bounded work and
    returns the reply value. `step()` runs one slice and says whether the reply is ready
    (then in `value`); an exception inside becomes an error reply, as in dispatch."""

    __slots__ = ("spec", "_steps", "value", "slices")

    def __init__(self, spec_name: str, steps: Generator[None, None, Reply]) -> None:
        spec = lookup(spec_name.encode())
        assert spec is not None, spec_name  # the name of the registered command returning it
        self.spec = spec
        self._steps = steps
        self.value: Reply = None
        self.slices = 0

    def step(self) -> bool:
        self.slices += 1
        try:
            next(self._steps)
        except StopIteration as done:
            self.value = done.value
            return True
        except CommandError as exc:
            self.value = ErrorReply(exc.message)
            return True
        except Exception as exc:
            self.value = _failure(self.spec, exc)
            return True
        return False

    def cancel(self) -> None:
        """The client went away: drop the work (and what it holds) now."""
        self._steps.close()
        self.value = None


def finish(reply: Reply) -> Reply:
    """The final value of a reply, running an Incremental to its end."""
    if type(reply) is Incremental:
        while not reply.step():
            pass
        return reply.value
    return reply


QUEUED = Status("QUEUED")
# Run at once inside MULTI rather than queued (WATCH to answer its own error there).
_TRANSACTION_CONTROL = frozenset({"EXEC", "DISCARD", "MULTI", "QUIT", "RESET", "WATCH"})
NOT_IN_MULTI = ErrorReply("ERR Command not allowed inside a transaction")


def dispatch(ctx: CommandContext, argv: list[bytes]) -> Reply:
    """Run one command and return its reply value; every failure becomes an ErrorReply."""
    spec = _TABLE.get(argv[0])
    client = ctx.client
    if (spec is None or spec.subcommands or client.multi is not None or not client.authenticated
            or ctx.server.persistence_error is not None):
        return _dispatch_checked(ctx, argv)
    arity = spec.arity
    if (len(argv) != arity) if arity > 0 else (len(argv) < -arity):
        return _refuse(ctx, spec, _wrong_arity(spec))
    handler = spec.handler
    assert handler is not None  # only a parent of subcommands has none, and it took the checked path
    started = perf_counter_ns()
    try:
        reply = handler(ctx, argv)
    except CommandError as exc:
        reply = ErrorReply(exc.message)
    except Exception as exc:  # the rare path: typed archive errors and bugs
        reply = _failure(spec, exc)
    _account(ctx, spec, argv, reply, perf_counter_ns() - started)
    return reply


def _dispatch_checked(ctx: CommandContext, argv: list[bytes]) -> Reply:
    """Dispatch with everything the common case skips: case folding, subcommands, auth, MULTI."""
    client = ctx.client
    spec = lookup(argv[0])
    if spec is None:
        return _refuse(ctx, None, _unknown(argv))
    if spec.subcommands and (len(argv) > 1 or spec.handler is None):
        if len(argv) < 2:
            return _refuse(ctx, spec, _wrong_arity(spec))
        found = _subcommand(spec, argv)
        if isinstance(found, ErrorReply):
            return _refuse(ctx, None, found)
        spec = found
    if not _arity_ok(spec.arity, len(argv)):
        return _refuse(ctx, spec, _wrong_arity(spec))
    if not client.authenticated and not spec.no_auth:
        if ctx.server.requirepass is not None:
            return _refuse(ctx, spec, NOAUTH)
        if ctx.server.refuses(client):  # the password was removed: protected mode holds
            client.close_after_reply = True
            return DENIED
        client.authenticated = True  # the password was removed (CONFIG SET requirepass "")
    if ctx.server.persistence_error is not None and _writes(spec, client):
        if spec.name == "EXEC":
            client.end_transaction()
        return _refuse(ctx, spec, MISCONF)
    if client.multi is not None and spec.name not in _TRANSACTION_CONTROL:
        if "no_multi" in spec.flags:
            return _refuse(ctx, spec, NOT_IN_MULTI)
        if ctx.archive.max_bytes < ENTRY_OVERHEAD or not fits_budget(ctx, spec, argv):
            # Nothing fits at all: Redis, out of memory, refuses queueing any command.
            return _refuse(ctx, spec, ErrorReply(OOM))
        client.multi.append((spec, argv))
        return QUEUED
    return call(spec, ctx, argv)


def key_positions(spec: CommandSpec, argv: list[bytes]) -> list[int]:
    """Where the keys are in `argv`, from the spec's (first, last, step); last < 0 counts
    from the end (MSET's -1)."""
    first, last, step = spec.keys
    if first == 0:
        return []
    end = last if last >= 0 else len(argv) + last
    return list(range(first, min(end, len(argv) - 1) + 1, step))


def fits_budget(ctx: CommandContext, spec: CommandSpec, argv: list[bytes]) -> bool:
    """False when a command that uses memory (flag `denyoom`) cannot fit the L1 budget
    whatever it writes: even its smallest entry, a key with no value, would be larger than
    the whole budget (after CONFIG SET maxmemory 1, say). Checked where Redis checks for
    OOM ahead of running a command: while queueing it in MULTI and at EXEC."""
    if "denyoom" not in spec.flags:
        return True
    budget = ctx.archive.max_bytes
    return all(len(argv[i]) + ENTRY_OVERHEAD <= budget for i in key_positions(spec, argv))


def _writes(spec: CommandSpec, client: ClientState) -> bool:
    """A write command, or an EXEC of a transaction holding one."""
    if spec.name == "EXEC":
        multi = client.multi
        return multi is not None and any(queued.writes for queued, _ in multi)
    return spec.writes


def _refuse(ctx: CommandContext, spec: CommandSpec | None, error: ErrorReply) -> ErrorReply:
    """A command refused before it ran: a rejected call of `spec` (when known) in
    commandstats, an error in errorstats, and inside MULTI a transaction EXEC will discard."""
    client = ctx.client
    if client.multi is not None:
        client.multi_failed = True  # EXEC will discard the transaction, as Redis does
    stats = ctx.server.stats
    if spec is not None:
        stats.command(spec.fullname)[2] += 1
    stats.error(error)
    return error


def call(spec: CommandSpec, ctx: CommandContext, argv: list[bytes]) -> Reply:
    """Run a resolved command, turning its exceptions into error replies; SLOWLOG times it
    (EXEC is not logged itself: each command it runs is)."""
    handler = spec.handler
    assert handler is not None  # a resolved command: a parent without a handler of its own never is
    started = perf_counter_ns()
    try:
        reply = handler(ctx, argv)
    except CommandError as exc:
        reply = ErrorReply(exc.message)
    except Exception as exc:
        reply = _failure(spec, exc)
    _account(ctx, spec, argv, reply, perf_counter_ns() - started)
    return reply


def _account(ctx: CommandContext, spec: CommandSpec, argv: list[bytes], reply: Reply, elapsed_ns: int) -> None:
    """A command that ran: its call, time and failure in commandstats (its error in
    errorstats), and the slow log when it took long enough."""
    server = ctx.server
    counters = server.stats.command(spec.fullname)
    counters[0] += 1
    counters[1] += elapsed_ns
    if type(reply) is ErrorReply:
        counters[3] += 1
        server.stats.error(reply)
    slowlog = server.slowlog
    if 0 <= slowlog.log_slower_than_us * 1000 <= elapsed_ns and "skip_slowlog" not in spec.flags:
        slowlog.record(argv, elapsed_ns // 1000, ctx.client)


def _failure(spec: CommandSpec, exc: Exception) -> ErrorReply:
    """The one place where archive errors and bugs become error replies."""
    if isinstance(exc, ArchiveOOMError):
        return ErrorReply(OOM)
    if isinstance(exc, ArchiveError):
        return ErrorReply(f"ERR {exc}")
    # A bug in one command must not take the connection or the server down.
    log.error("command %s failed", spec.name, exc_info=exc)
    return ErrorReply(f"ERR internal error while running '{spec.fullname}'; see the server log")
