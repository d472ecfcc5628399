"""Key commands: DEL UNLINK EXISTS EXPIRE* PEXPIRE* TTL PTTL PERSIST TYPE KEYS SCAN."""

from __future__ import annotations

from arca.commands.args import SYNTAX, expire_at_ms, now_ms, parse_int
from arca.commands.glob import Glob, compile_glob
from arca.commands.registry import CommandContext, CommandError, Incremental, Status, command

_KEYS = (1, -1, 1)
# KEYS yields to other clients after this much matching work: key bytes times the
# pattern's tokens, plus KEY_WORK per key (a few milliseconds of work at most).
KEYS_SLICE_WORK = 1 << 18
KEY_WORK = 64
_KEY = (1, 1, 1)


@command("DEL", arity=-2, flags=("write",), group="generic", summary="Delete keys", args="key [key ...]", keys=_KEYS)
def delete(ctx: CommandContext, argv: list[bytes]):
    remove = ctx.archive.delete
    return sum(1 for key in argv[1:] if remove(key))


@command("UNLINK", arity=-2, flags=("write", "fast"), group="generic", summary="Delete keys", args="key [key ...]", since="4.0.0", keys=_KEYS)
def unlink(ctx: CommandContext, argv: list[bytes]):
    return delete(ctx, argv)


@command("EXISTS", arity=-2, flags=("readonly", "fast"), group="generic", summary="Count existing keys", args="key [key ...]", keys=_KEYS)
def exists(ctx: CommandContext, argv: list[bytes]):
    present = ctx.archive.exists
    return sum(1 for key in argv[1:] if present(key))


def _expire(ctx: CommandContext, argv: list[bytes], unit_ms: int, absolute: bool) -> int:
    name = argv[0].decode().lower()
    flags = {arg.upper() for arg in argv[3:]}
    for arg in argv[3:]:
        if arg.upper() not in (b"NX", b"XX", b"GT", b"LT"):
            raise CommandError(f"ERR Unsupported option {arg.decode('utf-8', 'replace')}")
    if b"NX" in flags and flags & {b"XX", b"GT", b"LT"}:
        raise CommandError("ERR NX and XX, GT or LT options at the same time are not compatible")
    if {b"GT", b"LT"} <= flags:
        raise CommandError("ERR GT and LT options at the same time are not compatible")
    when = expire_at_ms(parse_int(argv[2]), unit_ms, absolute, name)  # after the options, as Redis
    found = ctx.archive.get_for_update(argv[1])
    if found is None:
        return 0
    current = found[1]
    if (b"NX" in flags and current is not None) or (b"XX" in flags and current is None):
        return 0
    if b"GT" in flags and (current is None or when <= current):
        return 0
    if b"LT" in flags and current is not None and when >= current:
        return 0
    if when <= now_ms():
        ctx.archive.delete(argv[1])
        return 1
    return int(ctx.archive.set_expire(argv[1], when))


_EXPIRE_ARGS = "key {} [NX | XX | GT | LT]"


@command("EXPIRE", arity=-3, flags=("write", "fast"), group="generic", summary="Set a key's TTL in seconds", args=_EXPIRE_ARGS.format("seconds"), keys=_KEY)
def expire(ctx: CommandContext, argv: list[bytes]):
    return _expire(ctx, argv, 1000, False)


@command("PEXPIRE", arity=-3, flags=("write", "fast"), group="generic", summary="Set a key's TTL in milliseconds", args=_EXPIRE_ARGS.format("milliseconds"), since="2.6.0", keys=_KEY)
def pexpire(ctx: CommandContext, argv: list[bytes]):
    return _expire(ctx, argv, 1, False)


@command("EXPIREAT", arity=-3, flags=("write", "fast"), group="generic", summary="Set a key's expiry as a unix time in seconds", args=_EXPIRE_ARGS.format("unix-time-seconds"), since="1.2.0", keys=_KEY)
def expireat(ctx: CommandContext, argv: list[bytes]):
    return _expire(ctx, argv, 1000, True)


@command("PEXPIREAT", arity=-3, flags=("write", "fast"), group="generic", summary="Set a key's expiry as a unix time in milliseconds", args=_EXPIRE_ARGS.format("unix-time-milliseconds"), since="2.6.0", keys=_KEY)
def pexpireat(ctx: CommandContext, argv: list[bytes]):
    return _expire(ctx, argv, 1, True)


def _ttl_ms(ctx: CommandContext, key: bytes) -> int:
    found = ctx.archive.peek(key)  # TTL leaves the key's LRU place, as in Redis
    if found is None:
        return -2
    if found[1] is None:
        return -1
    return max(found[1] - now_ms(), 0)


@command("TTL", arity=2, flags=("readonly", "fast"), group="generic", summary="A key's remaining TTL in seconds", args="key", keys=_KEY)
def ttl(ctx: CommandContext, argv: list[bytes]):
    remaining = _ttl_ms(ctx, argv[1])
    return remaining if remaining < 0 else (remaining + 500) // 1000


@command("PTTL", arity=2, flags=("readonly", "fast"), group="generic", summary="A key's remaining TTL in milliseconds", args="key", since="2.6.0", keys=_KEY)
def pttl(ctx: CommandContext, argv: list[bytes]):
    return _ttl_ms(ctx, argv[1])


@command("PERSIST", arity=2, flags=("write", "fast"), group="generic", summary="Remove a key's TTL", args="key", since="2.2.0", keys=_KEY)
def persist(ctx: CommandContext, argv: list[bytes]):
    found = ctx.archive.get_for_update(argv[1])
    if found is None or found[1] is None:
        return 0
    return int(ctx.archive.set_expire(argv[1], None))


@command("TYPE", arity=2, flags=("readonly", "fast"), group="generic", summary="The type of a key's value", args="key", keys=_KEY)
def type_(ctx: CommandContext, argv: list[bytes]):
    return Status("string" if ctx.archive.exists(argv[1]) else "none")


@command("KEYS", arity=2, flags=("readonly",), group="generic", summary="All keys matching a pattern", args="pattern")
def keys(ctx: CommandContext, argv: list[bytes]):
    return Incremental("KEYS", matching_keys(ctx.archive, compile_glob(argv[1])))


def matching_keys(archive, glob: Glob, budget: int | None = None):
    """The live keys matching, yielding after each `budget` of work (see Incremental).

    The key list is taken when KEYS starts; each key is checked (still there, not expired)
    when its slice reaches it, so keys written or deleted while KEYS runs may or may not be
    listed, as with SCAN."""
    found: list[bytes] = []
    append = found.append
    matches = glob.match
    per_byte = glob.cost_per_byte
    budget = budget or KEYS_SLICE_WORK
    work = 0
    for key in archive.keys():
        if matches(key):
            append(key)
        work += KEY_WORK + len(key) * per_byte
        if work >= budget:
            work = 0
            yield
    return found


@command("SCAN", arity=-2, flags=("readonly",), group="generic", summary="Iterate over the keys", args="cursor [MATCH pattern] [COUNT count] [TYPE type]", since="2.8.0")
def scan(ctx: CommandContext, argv: list[bytes]):
    cursor = parse_int(argv[1], "ERR invalid cursor")
    if cursor < 0:
        raise CommandError("ERR invalid cursor")
    count, pattern, wanted_type = 10, None, None
    i = 2
    while i < len(argv):
        option = argv[i].upper()
        if i + 1 >= len(argv):
            raise CommandError(SYNTAX)
        if option == b"COUNT":
            count = parse_int(argv[i + 1])
            if count < 1:
                raise CommandError(SYNTAX)
        elif option == b"MATCH":
            pattern = argv[i + 1]
        elif option == b"TYPE":
            wanted_type = argv[i + 1].lower()
        else:
            raise CommandError(SYNTAX)
        i += 2
    following, batch = ctx.archive.scan(cursor, count)
    if pattern is not None:
        matches = compile_glob(pattern)
        batch = [key for key in batch if matches(key)]
    if wanted_type not in (None, b"string"):
        batch = []
    return [str(following).encode(), batch]
