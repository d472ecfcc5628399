"""Redis glob patterns (KEYS, SCAN MATCH, CONFIG GET): `*`, `?`, `[abc]`, `[^a-z]`, `\\x` escapes."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable


@lru_cache(maxsize=256)
def compile_glob(pattern: bytes) -> Callable[[bytes], bool]:
    """A predicate telling whether a key matches `pattern` as Redis's stringmatchlen would."""
    if pattern == b"*":
        return lambda key: True
    out = bytearray()
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i : i + 1]
        if ch == b"*":
            out += b".*"
        elif ch == b"?":
            out += b"."
        elif ch == b"\\" and i + 1 < n:
            i += 1
            out += re.escape(pattern[i : i + 1])
        elif ch == b"[":
            i, cls = _char_class(pattern, i + 1)
            out += cls
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(bytes(out), re.DOTALL).fullmatch  # type: ignore[return-value]


def _char_class(pattern: bytes, i: int) -> tuple[int, bytes]:
    """Translate `[...]` starting after the '['; returns the index of the closing ']'."""
    n = len(pattern)
    negate = i < n and pattern[i : i + 1] == b"^"
    if negate:
        i += 1
    parts = bytearray()
    while i < n and pattern[i : i + 1] != b"]":
        if pattern[i : i + 1] == b"\\" and i + 1 < n:
            i += 1
            parts += re.escape(pattern[i : i + 1])
        elif i + 2 < n and pattern[i + 1 : i + 2] == b"-" and pattern[i + 2 : i + 3] != b"]":
            low, high = sorted((pattern[i], pattern[i + 2]))
            parts += b"%s-%s" % (re.escape(bytes((low,))), re.escape(bytes((high,))))
            i += 2
        else:
            parts += re.escape(pattern[i : i + 1])
        i += 1
    if not parts:
        return i, b"[^\\x00-\\xff]" if not negate else b"[\\x00-\\xff]"
    return i, b"[" + (b"^" if negate else b"") + bytes(parts) + b"]"
