"""OBJECT (ENCODING REFCOUNT IDLETIME FREQ) and MEMORY USAGE: how a key is held.

ARCA keeps every value as a plain byte string, so OBJECT ENCODING answers what Redis answers
for a string of that shape (`int` for the canonical spelling of a 64-bit integer, at most 20
bytes, `embstr` up to 44 bytes, `raw` beyond) unless the archive's encoding hint says how
Redis would hold it after the commands that wrote it: `raw` after APPEND, SETRANGE or SETBIT
modified it, never `int` after INCRBYFLOAT. REFCOUNT is 1 (no shared objects under an
LRU budget, as in Redis). IDLETIME counts the seconds since the key was last read or
written, by the L1 table's clock (TTL, TYPE, EXISTS and OBJECT do not count as uses). FREQ needs an LFU policy, which ARCA does not have: it answers Redis's error.
MEMORY USAGE answers what the key costs against the L1 budget (key + value + the fixed
per-entry overhead). Missing keys answer nil.
"""

from __future__ import annotations

from arca.archive.archive import ENCODING_RAW, ENCODING_SHAPE
from arca.archive.config import ENTRY_OVERHEAD
from arca.commands.args import SYNTAX, parse_int
from arca.commands.registry import CommandContext, CommandError, command

_KEY = (2, 2, 1)
EMBSTR_MAX = 44
NO_LFU = ("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note "
          "that when switching between policies at runtime LRU and LFU data will take some time to adjust.")


def encoding_of(value: bytes, hint: int = ENCODING_SHAPE) -> bytes:
    """The encoding Redis would report for a string value with this archive hint."""
    if hint == ENCODING_RAW:
        return b"raw"
    if len(value) <= 20 and hint == ENCODING_SHAPE:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is not None and -(2**63) <= number < 2**63 and b"%d" % number == value:
            return b"int"
    return b"embstr" if len(value) <= EMBSTR_MAX else b"raw"


def _value(ctx: CommandContext, key: bytes) -> bytes | None:
    found = ctx.archive.peek(key)  # OBJECT leaves the key's LRU place, as in Redis
    return None if found is None else found[0]


@command("OBJECT|ENCODING", arity=3, flags=("readonly",), group="generic", summary="How a key's value is encoded", args="key", since="2.2.3", keys=_KEY)
def object_encoding(ctx: CommandContext, argv: list[bytes]):
    value = _value(ctx, argv[2])
    return None if value is None else encoding_of(value, ctx.archive.encoding(argv[2]) or ENCODING_SHAPE)


@command("OBJECT|REFCOUNT", arity=3, flags=("readonly",), group="generic", summary="References to a key's value", args="key", since="2.2.3", keys=_KEY)
def object_refcount(ctx: CommandContext, argv: list[bytes]):
    return None if _value(ctx, argv[2]) is None else 1


@command("OBJECT|IDLETIME", arity=3, flags=("readonly",), group="generic", summary="Seconds since a key was last read or written", args="key", since="2.2.3", keys=_KEY)
def object_idletime(ctx: CommandContext, argv: list[bytes]):
    return None if _value(ctx, argv[2]) is None else ctx.archive.idle_seconds(argv[2])


@command("OBJECT|FREQ", arity=3, flags=("readonly",), group="generic", summary="A key's access frequency (needs an LFU policy)", args="key", since="4.0.0", keys=_KEY)
def object_freq(ctx: CommandContext, argv: list[bytes]):
    if _value(ctx, argv[2]) is None:
        return None
    raise CommandError(NO_LFU)


@command("MEMORY|USAGE", arity=-3, flags=("readonly",), group="server", summary="Bytes a key costs against the L1 budget", args="key [SAMPLES count]", since="4.0.0", keys=_KEY)
def memory_usage(ctx: CommandContext, argv: list[bytes]):
    i = 3
    while i < len(argv):
        if argv[i].upper() == b"SAMPLES" and i + 1 < len(argv):
            parse_int(argv[i + 1])
            i += 2
        else:
            raise CommandError(SYNTAX)
    found = ctx.archive.get_for_update(argv[2], touch=False)  # not a read, as in Redis
    return None if found is None else len(argv[2]) + len(found[0]) + ENTRY_OVERHEAD
