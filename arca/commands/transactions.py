"""MULTI / EXEC / DISCARD: queue a connection's commands and run them together.

The server runs every command on one thread, so an EXEC is atomic by construction: no other
client's command runs between the queued ones. redis-py's default pipeline
(`transaction=True`) wraps its commands this way. WATCH is not offered.
"""

from __future__ import annotations

from arca.commands.registry import CommandContext, CommandError, call, command, finish
from arca.protocol import OK


@command("MULTI", arity=1, flags=("fast",), group="transactions", summary="Start a transaction", since="1.2.0")
def multi(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is not None:
        raise CommandError("ERR MULTI calls can not be nested")
    ctx.client.multi = []
    return OK


@command("EXEC", arity=1, group="transactions", summary="Run the commands queued since MULTI", since="1.2.0")
def exec_(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is None:
        raise CommandError("ERR EXEC without MULTI")
    failed = ctx.client.multi_failed
    queued = ctx.client.end_transaction()
    if failed:
        raise CommandError("EXECABORT Transaction discarded because of previous errors.")
    return [finish(call(spec, ctx, queued_argv)) for spec, queued_argv in queued]


@command("DISCARD", arity=1, flags=("fast",), group="transactions", summary="Drop the commands queued since MULTI", since="2.0.0")
def discard(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is None:
        raise CommandError("ERR DISCARD without MULTI")
    ctx.client.end_transaction()
    return OK
