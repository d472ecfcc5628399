"""String commands over L1 entries: GET SET SETNX SETEX PSETEX GETDEL MGET MSET INCR* DECR* APPEND STRLEN.

Every value is a string; a write keeps or replaces the key's TTL exactly as Redis does
(SET drops it unless KEEPTTL; INCR, APPEND and friends keep it).
"""

from __future__ import annotations

from arca.archive.archive import ENCODING_RAW
from arca.commands.args import INT_MAX, INT_MIN, SYNTAX, TOO_LONG, expire_at_ms, parse_int, value_size_limit
from arca.commands.registry import CommandContext, CommandError, command
from arca.protocol import OK

_KEY = (1, 1, 1)
_EXPIRE_UNITS = {b"EX": (1000, False), b"PX": (1, False), b"EXAT": (1000, True), b"PXAT": (1, True)}


@command("GET", arity=2, flags=("readonly", "fast"), group="string", summary="Get the value of a key", args="key", keys=_KEY)
def get(ctx: CommandContext, argv: list[bytes]):
    return ctx.archive.get(argv[1])


@command("SET", arity=-3, flags=("write", "denyoom"), group="string", summary="Set the string value of a key", args="key value [NX | XX] [GET] [EX seconds | PX milliseconds | EXAT unix-time-seconds | PXAT unix-time-milliseconds | KEEPTTL]", keys=_KEY)
def set_(ctx: CommandContext, argv: list[bytes]):
    key, value = argv[1], argv[2]
    archive = ctx.archive
    if len(argv) == 3:  # the common case: no options
        archive.put(key, value)
        return OK
    condition = expiry = None
    keep_ttl = want_old = False
    expire_at = None
    i = 3
    while i < len(argv):
        option = argv[i].upper()
        # An option may repeat (the last value counts), never meet its alternatives.
        if option in (b"NX", b"XX") and condition in (None, option):
            condition = option
        elif option == b"GET":
            want_old = True
        elif option == b"KEEPTTL" and expiry is None:
            keep_ttl = True
        elif option in _EXPIRE_UNITS and expiry in (None, option) and not keep_ttl and i + 1 < len(argv):
            expiry = option
            amount = parse_int(argv[i + 1])
            if amount <= 0:
                raise CommandError("ERR invalid expire time in 'set' command")
            unit, absolute = _EXPIRE_UNITS[option]
            expire_at = expire_at_ms(amount, unit, absolute, "set")
            i += 1
        else:
            raise CommandError(SYNTAX)
        i += 1
    old = archive.get_entry(key) if (want_old or keep_ttl or condition) else None
    if (condition == b"NX" and old is not None) or (condition == b"XX" and old is None):
        return old.value if (want_old and old is not None) else None
    if keep_ttl and old is not None:
        expire_at = old.expire_at_ms
    archive.put(key, value, expire_at)
    if want_old:
        return None if old is None else old.value
    return OK


@command("SETNX", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Set a key only if it does not exist", args="key value", keys=_KEY)
def setnx(ctx: CommandContext, argv: list[bytes]):
    if ctx.archive.exists(argv[1]):
        return 0
    ctx.archive.put(argv[1], argv[2])
    return 1


def _set_with_ttl(ctx: CommandContext, argv: list[bytes], unit_ms: int, name: str):
    amount = parse_int(argv[2])
    if amount <= 0:
        raise CommandError(f"ERR invalid expire time in '{name}' command")
    ctx.archive.put(argv[1], argv[3], expire_at_ms(amount, unit_ms, False, name))
    return OK


@command("SETEX", arity=4, flags=("write", "denyoom"), group="string", summary="Set a key with a TTL in seconds", args="key seconds value", keys=_KEY)
def setex(ctx: CommandContext, argv: list[bytes]):
    return _set_with_ttl(ctx, argv, 1000, "setex")


@command("PSETEX", arity=4, flags=("write", "denyoom"), group="string", summary="Set a key with a TTL in milliseconds", args="key milliseconds value", keys=_KEY)
def psetex(ctx: CommandContext, argv: list[bytes]):
    return _set_with_ttl(ctx, argv, 1, "psetex")


@command("GETDEL", arity=2, flags=("write", "fast"), group="string", summary="Get a key's value and delete the key", args="key", since="6.2.0", keys=_KEY)
def getdel(ctx: CommandContext, argv: list[bytes]):
    value = ctx.archive.get(argv[1])
    if value is not None:
        ctx.archive.delete(argv[1])
    return value


@command("MGET", arity=-2, flags=("readonly", "fast"), group="string", summary="Get the values of several keys", args="key [key ...]", keys=(1, -1, 1))
def mget(ctx: CommandContext, argv: list[bytes]):
    get_value = ctx.archive.get
    return [get_value(key) for key in argv[1:]]


@command("MSET", arity=-3, flags=("write", "denyoom"), group="string", summary="Set several keys", args="key value [key value ...]", keys=(1, -1, 2))
def mset(ctx: CommandContext, argv: list[bytes]):
    if len(argv) % 2 == 0:
        raise CommandError("ERR wrong number of arguments for 'mset' command")
    ctx.archive.put_many(list(zip(argv[1::2], argv[2::2])))
    return OK


def _add(ctx: CommandContext, key: bytes, delta: int) -> int:
    archive = ctx.archive
    found = archive.get_with_deadline(key)
    if found is None:
        result, expire_at = delta, None
    else:
        result, expire_at = parse_int(found[0]) + delta, found[1]
    if not INT_MIN <= result <= INT_MAX:
        raise CommandError("ERR increment or decrement would overflow")
    archive.put(key, b"%d" % result, expire_at)
    return result


@command("INCR", arity=2, flags=("write", "denyoom", "fast"), group="string", summary="Increment the integer value of a key by one", args="key", keys=_KEY)
def incr(ctx: CommandContext, argv: list[bytes]):
    return _add(ctx, argv[1], 1)


@command("DECR", arity=2, flags=("write", "denyoom", "fast"), group="string", summary="Decrement the integer value of a key by one", args="key", keys=_KEY)
def decr(ctx: CommandContext, argv: list[bytes]):
    return _add(ctx, argv[1], -1)


@command("INCRBY", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Increment the integer value of a key", args="key increment", keys=_KEY)
def incrby(ctx: CommandContext, argv: list[bytes]):
    return _add(ctx, argv[1], parse_int(argv[2]))


@command("DECRBY", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Decrement the integer value of a key", args="key decrement", keys=_KEY)
def decrby(ctx: CommandContext, argv: list[bytes]):
    amount = parse_int(argv[2])
    if amount == INT_MIN:
        raise CommandError("ERR decrement would overflow")
    return _add(ctx, argv[1], -amount)


@command("APPEND", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Append a value to a key", args="key value", keys=_KEY)
def append(ctx: CommandContext, argv: list[bytes]):
    found = ctx.archive.get_with_deadline(argv[1])
    if found is None:
        ctx.archive.put(argv[1], argv[2])
        return len(argv[2])
    if len(found[0]) + len(argv[2]) > value_size_limit(ctx):
        raise CommandError(TOO_LONG)
    value = found[0] + argv[2]
    ctx.archive.put(argv[1], value, found[1])
    ctx.archive.set_encoding(argv[1], ENCODING_RAW)  # appended to in place (a new key: by its shape)
    return len(value)


@command("STRLEN", arity=2, flags=("readonly", "fast"), group="string", summary="Length of a key's value", args="key", keys=_KEY)
def strlen(ctx: CommandContext, argv: list[bytes]):
    value = ctx.archive.get(argv[1])
    return 0 if value is None else len(value)
