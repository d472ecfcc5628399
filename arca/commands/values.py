"""String commands that read and replace whole values: GETEX GETSET MSETNX INCRBYFLOAT.

GETEX changes only the TTL; GETSET drops it (as SET does); INCRBYFLOAT keeps it (as INCR
does). INCRBYFLOAT computes in 80-bit extended precision (numpy's longdouble, C's long
double on x86) and prints the result with 17 decimals, trailing zeros removed, so its
results match Redis's digit for digit.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from arca.archive.archive import ENCODING_STRING
from arca.commands.args import SYNTAX, expire_at_ms, now_ms, parse_int
from arca.commands.registry import CommandContext, CommandError, command

_KEY = (1, 1, 1)
_EXPIRE_UNITS = {b"EX": (1000, False), b"PX": (1, False), b"EXAT": (1000, True), b"PXAT": (1, True)}
NOT_FLOAT = "ERR value is not a valid float"
# The longest number text accepted (Redis's MAX_LONG_DOUBLE_CHARS).
MAX_FLOAT_CHARS = 5 * 1024
_DECIMAL = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INFINITY = re.compile(rb"[+-]?(inf|infinity)", re.IGNORECASE)
_HEX = re.compile(rb"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)([pP][+-]?\d+)?")


@command("GETEX", arity=-2, flags=("write", "fast"), group="string", summary="Get a key's value and set or remove its TTL", args="key [EX seconds | PX milliseconds | EXAT unix-time-seconds | PXAT unix-time-milliseconds | PERSIST]", since="6.2.0", keys=_KEY)
def getex(ctx: CommandContext, argv: list[bytes]):
    option = amount_arg = None
    i = 2
    while i < len(argv):
        word = argv[i].upper()
        if option in (None, word) and word == b"PERSIST":
            option = word
        elif option in (None, word) and word in _EXPIRE_UNITS and i + 1 < len(argv):
            option, amount_arg = word, argv[i + 1]
            i += 1
        else:
            raise CommandError(SYNTAX)
        i += 1
    archive = ctx.archive
    found = archive.get_with_deadline(argv[1])
    if found is None:
        return None
    value, deadline = found
    if option == b"PERSIST":
        if deadline is not None:
            archive.set_expire(argv[1], None)
    elif option is not None:
        assert amount_arg is not None  # read with every option but PERSIST
        amount = parse_int(amount_arg)
        if amount <= 0:
            raise CommandError("ERR invalid expire time in 'getex' command")
        unit, absolute = _EXPIRE_UNITS[option]
        when = expire_at_ms(amount, unit, absolute, "getex")
        if when <= now_ms():
            archive.delete(argv[1])
        else:
            archive.set_expire(argv[1], when)
    return value


@command("GETSET", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Set a key's value and return the old one", args="key value", keys=_KEY)
def getset(ctx: CommandContext, argv: list[bytes]):
    old = ctx.archive.get(argv[1])
    ctx.archive.put(argv[1], argv[2])
    return old


@command("MSETNX", arity=-3, flags=("write", "denyoom"), group="string", summary="Set several keys only if none of them exists", args="key value [key value ...]", since="1.0.1", keys=(1, -1, 2))
def msetnx(ctx: CommandContext, argv: list[bytes]):
    if len(argv) % 2 == 0:
        raise CommandError("ERR wrong number of arguments for 'msetnx' command")
    exists = ctx.archive.exists
    if any(exists(key) for key in argv[1::2]):
        return 0
    ctx.archive.put_many(list(zip(argv[1::2], argv[2::2])))
    return 1


def parse_long_double(text: bytes) -> np.longdouble:
    """A number as C's strtold reads it, with Redis's refusals: spaces, trailing bytes, NaN,
    overflow and underflow to zero; NOT_FLOAT otherwise."""
    if not text or len(text) >= MAX_FLOAT_CHARS:
        raise CommandError(NOT_FLOAT)
    if _DECIMAL.fullmatch(text):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # overflow is checked below
            value = np.longdouble(text.decode("ascii"))
        mantissa = text.lower().partition(b"e")[0]
        if np.isinf(value) or (value == 0 and mantissa.strip(b"+-.0")):
            raise CommandError(NOT_FLOAT)  # out of the long double's range
        return value
    if _INFINITY.fullmatch(text):
        return np.longdouble("-inf" if text.startswith(b"-") else "inf")
    if _HEX.fullmatch(text):
        return np.longdouble(float.fromhex(text.decode("ascii")))
    raise CommandError(NOT_FLOAT)


def format_long_double(value: np.longdouble) -> bytes:
    """Redis's human-readable long double: 17 decimals, trailing zeros and point removed."""
    text = np.format_float_positional(value, precision=17, unique=False, fractional=True, trim="k")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return b"0" if text == "-0" else text.encode("ascii")


@command("INCRBYFLOAT", arity=3, flags=("write", "denyoom", "fast"), group="string", summary="Increment the floating point value of a key", args="key increment", since="2.6.0", keys=_KEY)
def incrbyfloat(ctx: CommandContext, argv: list[bytes]):
    archive = ctx.archive
    found = archive.get_for_update(argv[1])
    current = np.longdouble(0) if found is None else parse_long_double(found[0])
    increment = parse_long_double(argv[2])
    with np.errstate(all="ignore"):
        result = current + increment
    if not np.isfinite(result):
        raise CommandError("ERR increment would produce NaN or Infinity")
    text = format_long_double(result)
    archive.put(argv[1], text, None if found is None else found[1])
    archive.set_encoding(argv[1], ENCODING_STRING)  # Redis stores the result as a string, never int
    return text

