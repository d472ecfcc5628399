"""SLOWLOG GET/LEN/RESET: the commands that ran longer than slowlog-log-slower-than.

Dispatch times every command it runs and records the slow ones in the server's SlowLog
(arca/state.py); CONFIG GET/SET `slowlog-log-slower-than` (microseconds; 0 logs every
command, a negative value none) and `slowlog-max-len` steer it. While the threshold is
below a millisecond, the server sends plain GET/SET/INCR/... through dispatch too (they
are otherwise answered in C, untimed), so every command is timed on its own.
"""

from __future__ import annotations

from arca.commands.args import parse_int
from arca.commands.registry import CommandContext, CommandError, command
from arca.protocol import OK


@command("SLOWLOG|GET", arity=-2, flags=("admin", "loading", "stale"), group="server", summary="The newest slow log entries (10 unless a count is given, -1 for all)", args="[count]", since="2.2.12")
def slowlog_get(ctx: CommandContext, argv: list[bytes]):
    entries = ctx.server.slowlog.entries
    count = 10
    if len(argv) > 3:
        raise CommandError("ERR unknown subcommand or wrong number of arguments for 'GET'. Try SLOWLOG HELP.")
    if len(argv) == 3:
        count = parse_int(argv[2], "ERR count should be greater than or equal to -1")
        if count < -1:
            raise CommandError("ERR count should be greater than or equal to -1")
        if count == -1:
            count = len(entries)
    return [[entry_id, when, duration, list(args), addr, name]
            for entry_id, when, duration, args, addr, name in list(entries)[:count]]


@command("SLOWLOG|LEN", arity=2, flags=("admin", "loading", "stale"), group="server", summary="Number of entries in the slow log", since="2.2.12")
def slowlog_len(ctx: CommandContext, argv: list[bytes]):
    return len(ctx.server.slowlog.entries)


@command("SLOWLOG|RESET", arity=2, flags=("admin", "loading", "stale"), group="server", summary="Empty the slow log", since="2.2.12")
def slowlog_reset(ctx: CommandContext, argv: list[bytes]):
    ctx.server.slowlog.entries.clear()
    return OK
