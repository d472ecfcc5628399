"""Keyspace commands that move, copy, pick or inspect keys: COPY RENAME RENAMENX RANDOMKEY
TOUCH EXPIRETIME PEXPIRETIME.

A copied or renamed key keeps its TTL. There is one database (0): COPY's DB option takes 0
and answers Redis's out-of-range error for any other index.
"""

from __future__ import annotations

from arca.archive.archive import ENCODING_SHAPE
from arca.commands.args import SYNTAX, parse_int
from arca.commands.registry import CommandContext, CommandError, command
from arca.protocol import OK

_KEY = (1, 1, 1)
NO_SUCH_KEY = "ERR no such key"


@command("COPY", arity=-3, flags=("write", "denyoom"), group="generic", summary="Copy a key's value and TTL to another key", args="source destination [DB destination-db] [REPLACE]", since="6.2.0", keys=(1, 2, 1))
def copy(ctx: CommandContext, argv: list[bytes]):
    replace = False
    i = 3
    while i < len(argv):
        option = argv[i].upper()
        if option == b"REPLACE":
            replace = True
        elif option == b"DB" and i + 1 < len(argv):
            if parse_int(argv[i + 1]) != 0:
                raise CommandError("ERR DB index is out of range")
            i += 1
        else:
            raise CommandError(SYNTAX)
        i += 1
    source, destination = argv[1], argv[2]
    if source == destination:
        raise CommandError("ERR source and destination objects are the same")
    archive = ctx.archive
    found = archive.get_with_deadline(source)
    if found is None or (not replace and archive.exists(destination)):
        return 0
    archive.put(destination, found[0], found[1])
    archive.set_encoding(destination, archive.encoding(source) or ENCODING_SHAPE)  # a copy of the object
    return 1


def _rename(ctx: CommandContext, argv: list[bytes], only_new: bool):
    source, destination = argv[1], argv[2]
    archive = ctx.archive
    found = archive.get_for_update(source)
    if found is None:
        raise CommandError(NO_SUCH_KEY)
    if source == destination:
        return 0 if only_new else OK
    if only_new and archive.exists(destination):
        return 0
    archive.put(destination, found[0], found[1])  # first: an OOM refusal changes nothing
    archive.set_encoding(destination, archive.encoding(source) or ENCODING_SHAPE)  # the same object
    archive.delete(source)
    return 1 if only_new else OK


@command("RENAME", arity=3, flags=("write",), group="generic", summary="Rename a key", args="key newkey", keys=(1, 2, 1))
def rename(ctx: CommandContext, argv: list[bytes]):
    return _rename(ctx, argv, only_new=False)


@command("RENAMENX", arity=3, flags=("write", "fast"), group="generic", summary="Rename a key only if the new name is free", args="key newkey", keys=(1, 2, 1))
def renamenx(ctx: CommandContext, argv: list[bytes]):
    return _rename(ctx, argv, only_new=True)


@command("RANDOMKEY", arity=1, flags=("readonly",), group="generic", summary="A random key")
def randomkey(ctx: CommandContext, argv: list[bytes]):
    return ctx.archive.random_key()


@command("TOUCH", arity=-2, flags=("readonly", "fast"), group="generic", summary="Count existing keys and mark them as used", args="key [key ...]", since="3.2.1", keys=(1, -1, 1))
def touch(ctx: CommandContext, argv: list[bytes]):
    get = ctx.archive.get  # a read: moves the key to the recent end of the LRU order
    return sum(1 for key in argv[1:] if get(key) is not None)


def _expire_time(ctx: CommandContext, key: bytes) -> int:
    found = ctx.archive.peek(key)  # leaves the key's LRU place, as in Redis
    if found is None:
        return -2
    return -1 if found[1] is None else found[1]


@command("EXPIRETIME", arity=2, flags=("readonly", "fast"), group="generic", summary="A key's expiry as a unix time in seconds", args="key", since="7.0.0", keys=_KEY)
def expiretime(ctx: CommandContext, argv: list[bytes]):
    when = _expire_time(ctx, argv[1])
    return when if when < 0 else (when + 500) // 1000  # rounded, as Redis rounds TTL


@command("PEXPIRETIME", arity=2, flags=("readonly", "fast"), group="generic", summary="A key's expiry as a unix time in milliseconds", args="key", since="7.0.0", keys=_KEY)
def pexpiretime(ctx: CommandContext, argv: list[bytes]):
    return _expire_time(ctx, argv[1])
