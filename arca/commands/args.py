"""Argument parsing shared by commands, with Redis's error strings."""

from __future__ import annotations

import time

from arca.commands.registry import CommandError

NOT_INTEGER = "ERR value is not an integer or out of range"
SYNTAX = "ERR syntax error"
TOO_LONG = "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def parse_int(arg: bytes, error: str = NOT_INTEGER) -> int:
    """A signed 64-bit integer written strictly (Redis's string2ll: no spaces, '+' or leading 0)."""
    try:
        value = int(arg)
    except ValueError:
        raise CommandError(error) from None
    # int() also takes ' 7', '+7', '007' and '1_000'; only the canonical spelling round-trips.
    if INT_MIN <= value <= INT_MAX and b"%d" % value == arg:
        return value
    raise CommandError(error)


def value_size_limit(ctx) -> int:
    """The largest value a command may build (Redis: proto-max-bulk-len); the L1 budget may
    refuse smaller ones (-OOM)."""
    return ctx.server.options.limits.max_bulk_len


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def expire_at_ms(amount: int, unit_ms: int, absolute: bool, command: str) -> int:
    """Absolute unix-ms expiry for EX/PX/EXAT/PXAT style arguments; Redis's overflow rules.

    The bound on `amount` truncates toward zero as C's division does: -9223372036854776
    seconds is refused although its product with 1000 would fit once `now` is added.
    """
    if amount > INT_MAX // unit_ms or amount < -(-INT_MIN // unit_ms):
        raise CommandError(f"ERR invalid expire time in '{command}' command")
    when = amount * unit_ms
    if not absolute:
        when += now_ms()
    if when > INT_MAX or when < INT_MIN:
        raise CommandError(f"ERR invalid expire time in '{command}' command")
    return when


def has_spaces_or_specials(value: bytes) -> bool:
    """True when a CLIENT name/info value holds bytes outside '!'..'~' (Redis rejects those)."""
    return any(byte < 0x21 or byte > 0x7E for byte in value)
