"""MULTI / EXEC / DISCARD / WATCH / UNWATCH: queue a connection's commands and run them together.

The server runs every command on one thread, so an EXEC is atomic by construction: no other
client's command runs between the queued ones. redis-py's default pipeline
(`transaction=True`) wraps its commands this way. WATCH makes EXEC conditional: when a
watched key changed after WATCH (written, deleted, expired or evicted, by any connection
including this one), EXEC runs nothing and answers a null array (arca/archive/watch.py
says how changes are seen). Commands flagged `no_multi` (SHUTDOWN) are refused while
queueing, which aborts the transaction, as in Redis.
"""

from __future__ import annotations

from arca.archive.watch import Watcher
from arca.commands.registry import OOM, CommandContext, CommandError, call, command, finish, fits_budget
from arca.protocol import NULL_ARRAY, OK


def release_watch(ctx: CommandContext) -> None:
    """Forget the connection's watched keys (EXEC, DISCARD, UNWATCH, RESET, disconnect)."""
    watcher, ctx.client.watch = ctx.client.watch, None
    if watcher is not None:
        ctx.archive.unwatch(watcher)


@command("MULTI", arity=1, flags=("noscript", "loading", "stale", "fast", "allow_busy"), group="transactions", summary="Start a transaction", since="1.2.0")
def multi(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is not None:
        raise CommandError("ERR MULTI calls can not be nested")
    ctx.client.multi = []
    return OK


@command("EXEC", arity=1, flags=("noscript", "loading", "stale", "skip_slowlog"), group="transactions", summary="Run the commands queued since MULTI", since="1.2.0")
def exec_(ctx: CommandContext, argv: list[bytes]):
    queued = ctx.client.multi
    if queued is None:
        raise CommandError("ERR EXEC without MULTI")
    watcher = ctx.client.watch
    changed = watcher is not None and ctx.archive.watch_changed(watcher)
    release_watch(ctx)
    failed = ctx.client.multi_failed
    ctx.client.end_transaction()  # hands back `queued`
    if not all(fits_budget(ctx, spec, queued_argv) for spec, queued_argv in queued):
        raise CommandError(f"EXECABORT Transaction discarded because of: {OOM}")
    if failed:
        raise CommandError("EXECABORT Transaction discarded because of previous errors.")
    if changed:
        return NULL_ARRAY
    return [finish(call(spec, ctx, queued_argv)) for spec, queued_argv in queued]


@command("DISCARD", arity=1, flags=("noscript", "loading", "stale", "fast", "allow_busy"), group="transactions", summary="Drop the commands queued since MULTI", since="2.0.0")
def discard(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is None:
        raise CommandError("ERR DISCARD without MULTI")
    release_watch(ctx)
    ctx.client.end_transaction()
    return OK


@command("WATCH", arity=-2, flags=("noscript", "loading", "stale", "fast", "allow_busy"), group="transactions", summary="Make the next EXEC conditional on keys staying unchanged", args="key [key ...]", since="2.2.0", keys=(1, -1, 1))
def watch(ctx: CommandContext, argv: list[bytes]):
    if ctx.client.multi is not None:
        raise CommandError("ERR WATCH inside MULTI is not allowed")
    watcher = ctx.client.watch
    if watcher is None:
        watcher = ctx.client.watch = Watcher()
    ctx.archive.watch(watcher, [key for key in argv[1:] if key not in watcher.keys])
    return OK


@command("UNWATCH", arity=1, flags=("noscript", "loading", "stale", "fast", "allow_busy"), group="transactions", summary="Forget every watched key", since="2.2.0")
def unwatch(ctx: CommandContext, argv: list[bytes]):
    release_watch(ctx)
    return OK
