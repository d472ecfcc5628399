"""L3 KV-block commands: ARCA.KVPUT, ARCA.KVGET, ARCA.KVEXISTS (write-once blobs)."""

from __future__ import annotations

from arca.commands.registry import CommandContext, command


@command("ARCA.KVPUT", arity=3, flags=("write", "denyoom"), group="arca",
         summary="Store a KV block unless the key exists: 1 stored, 0 already present",
         args="key blob", keys=(1, 1, 1))
def arca_kvput(ctx: CommandContext, argv: list[bytes]):
    return int(ctx.archive.kv_put(argv[1], argv[2]))


@command("ARCA.KVGET", arity=2, flags=("readonly",), group="arca",
         summary="Get a KV block, or nil", args="key", keys=(1, 1, 1))
def arca_kvget(ctx: CommandContext, argv: list[bytes]):
    return ctx.archive.kv_get(argv[1])


@command("ARCA.KVEXISTS", arity=-2, flags=("readonly", "fast"), group="arca",
         summary="For each key, 1 if a KV block is stored, else 0", args="key [key ...]",
         keys=(1, -1, 1))
def arca_kvexists(ctx: CommandContext, argv: list[bytes]):
    return [int(found) for found in ctx.archive.kv_exists(argv[1:])]
