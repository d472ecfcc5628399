"""Bit commands over string values: SETBIT GETBIT BITCOUNT BITPOS.

Bit 0 is the most significant bit of the first byte, as in Redis. SETBIT grows the value
with zero bytes (keeping its TTL); the offset may not address a byte at or past
`proto-max-bulk-len`. BITCOUNT and BITPOS ranges are in bytes, or in bits with BIT;
negative ends count from the end of the value. A range is read as one Python integer, so
counting and searching run in C over the bytes.
"""

from __future__ import annotations

from arca.archive.archive import ENCODING_RAW
from arca.commands.args import NOT_INTEGER, SYNTAX, parse_int, value_size_limit
from arca.commands.registry import CommandContext, CommandError, command

_KEY = (1, 1, 1)
BAD_OFFSET = "ERR bit offset is not an integer or out of range"


def _bit_offset(ctx: CommandContext, arg: bytes) -> int:
    offset = parse_int(arg, BAD_OFFSET)
    if offset < 0 or (offset >> 3) >= value_size_limit(ctx):
        raise CommandError(BAD_OFFSET)
    return offset


@command("SETBIT", arity=4, flags=("write", "denyoom"), group="bitmap", summary="Set or clear one bit of a value", args="key offset value", since="2.2.0", keys=_KEY)
def setbit(ctx: CommandContext, argv: list[bytes]):
    offset = _bit_offset(ctx, argv[2])
    on = parse_int(argv[3], "ERR bit is not an integer or out of range")
    if on not in (0, 1):
        raise CommandError("ERR bit is not an integer or out of range")
    found = ctx.archive.get_for_update(argv[1])
    value, deadline = (b"", None) if found is None else found
    index, mask = offset >> 3, 0x80 >> (offset & 7)
    grown = found is None or len(value) <= index
    if len(value) <= index:
        value += bytes(index + 1 - len(value))
    byte = value[index]
    old = 1 if byte & mask else 0
    if grown or old != on:  # setting a bit to what it is changes nothing (WATCH sees no change)
        new = (byte | mask) if on else (byte & ~mask)
        ctx.archive.put(argv[1], value[:index] + bytes((new,)) + value[index + 1:], deadline)
        ctx.archive.set_encoding(argv[1], ENCODING_RAW)  # Redis modifies (or builds) a raw string
    return old


@command("GETBIT", arity=3, flags=("readonly", "fast"), group="bitmap", summary="One bit of a value", args="key offset", since="2.2.0", keys=_KEY)
def getbit(ctx: CommandContext, argv: list[bytes]):
    offset = _bit_offset(ctx, argv[2])
    value = ctx.archive.get(argv[1])
    index = offset >> 3
    if value is None or index >= len(value):
        return 0
    return 1 if value[index] & (0x80 >> (offset & 7)) else 0


def _bits(value: bytes, first: int, last: int) -> tuple[int, int]:
    """Bits first..last (inclusive, absolute) of value as (number, width); the number's most
    significant bit is bit `first`."""
    chunk = value[first >> 3:(last >> 3) + 1]
    tail = 7 - (last & 7)
    width = 8 * len(chunk) - tail - (first & 7)
    return (int.from_bytes(chunk, "big") >> tail) & ((1 << width) - 1), width


def _range(argv: list[bytes], start_at: int, length: int, bitcount: bool) -> tuple[int, int, bool] | None:
    """(first bit, last bit, end given) of the range in argv[start_at:], or None when empty.
    Ranges in bytes unless BIT follows start and end. BITCOUNT's ranges differ from BITPOS's
    in two details: the end is read before the unit, and two negative ends with start past
    end make an empty range before they are clamped (and before the unit is read)."""
    start = parse_int(argv[start_at], NOT_INTEGER) if len(argv) > start_at else 0
    end_given = len(argv) > start_at + 1
    # BITCOUNT reads both ends before the unit, BITPOS the unit before the end (Redis 7.0).
    end: int | None = None
    if end_given and bitcount:
        end = parse_int(argv[start_at + 1], NOT_INTEGER)
        if start < 0 and end < 0 and start > end:
            return None  # before the unit is looked at
    unit_bits = False
    if len(argv) > start_at + 2:
        unit = argv[start_at + 2].upper()
        if unit not in (b"BYTE", b"BIT") or len(argv) > start_at + 3:
            raise CommandError(SYNTAX)
        unit_bits = unit == b"BIT"
    if end_given and end is None:
        end = parse_int(argv[start_at + 1], NOT_INTEGER)
    total = length * 8 if unit_bits else length
    if end is None:
        end = total - 1
    if start < 0:
        start = max(total + start, 0)
    if end < 0:
        end = max(total + end, 0)
    end = min(end, total - 1)
    if start > end:
        return None
    if unit_bits:
        return start, end, end_given
    return start * 8, end * 8 + 7, end_given


@command("BITCOUNT", arity=-2, flags=("readonly",), group="bitmap", summary="Count the set bits of a value", args="key [start end [BYTE | BIT]]", since="2.6.0", keys=_KEY)
def bitcount(ctx: CommandContext, argv: list[bytes]):
    value = ctx.archive.get(argv[1])
    if value is None:
        return 0  # before any argument is looked at, as in Redis 7.0
    if len(argv) == 3 or len(argv) > 5:
        raise CommandError(SYNTAX)
    if len(argv) > 2:
        found = _range(argv, 2, len(value), bitcount=True)
    else:
        found = None if not value else (0, len(value) * 8 - 1, False)
    if found is None:
        return 0
    number, _ = _bits(value, found[0], found[1])
    return number.bit_count()


@command("BITPOS", arity=-3, flags=("readonly",), group="bitmap", summary="The first set or clear bit of a value", args="key bit [start [end [BYTE | BIT]]]", since="2.8.7", keys=_KEY)
def bitpos(ctx: CommandContext, argv: list[bytes]):
    bit = parse_int(argv[2])
    if bit not in (0, 1):
        raise CommandError("ERR The bit argument must be 1 or 0.")
    value = ctx.archive.get(argv[1])
    if value is None:
        return -1 if bit else 0
    if len(argv) > 6:
        raise CommandError(SYNTAX)
    found = _range(argv, 3, len(value), bitcount=False)
    if found is None:
        return -1
    first, last, end_given = found
    number, width = _bits(value, first, last)
    if bit == 0:
        number ^= (1 << width) - 1
    if number:
        return first + width - number.bit_length()
    if bit == 0 and not end_given:
        return last + 1  # the zero bits past the end of the value
    return -1
