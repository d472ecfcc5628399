"""Redis glob patterns (KEYS, SCAN MATCH, CONFIG GET): `*`, `?`, `[abc]`, `[^a-z]`, `\\x` escapes.

The semantics are Redis's (stringmatchlen): `?` is any one byte; `[...]` is one byte from
the set, `^` first negates it, `a-z` is a range (either order), `\\` escapes the next byte,
`]` right after `[` or `[^` closes an empty set, and a set left open runs to the end of the
pattern; ranges compare bytes as C's signed chars (0x80-0xff sort below 0x00); `\\`
outside a set escapes the next byte (a trailing `\\` is itself); consecutive stars are one
star; an empty key matches only the empty pattern and `*` itself. As in Redis, a pattern
with more than 1000 stars that are followed by something else matches nothing (Redis's
nesting limit).

The matching is linear in pattern x key, whatever the pattern. Every token but `*`
consumes exactly one byte, so the pattern splits at its stars into fixed-length segments:
the first is anchored at the start of the key, the last at its end, and each one between
is searched leftmost after the previous one. Taking the leftmost occurrence is always
safe (anything a later occurrence could match, the leftmost can too), so no segment is
ever tried twice: each costs at most its length times the bytes it is searched over. A
literal segment is searched with `bytes.find`; a segment with `?` or sets with a regular
expression made of one-byte atoms and fixed repeats (`.{12}`), with no alternation and no
variable quantifier, so it cannot backtrack either; a segment too long to compile quickly
(over REGEX_ATOMS atoms) is compared token by token. Compiling costs time linear in the
pattern: C speed for literals and stars, about a second per MiB of `?` and `[...]`.
(The previous translation into one regular expression with `.*` for each star backtracked
exponentially: a few stars against one long key froze the server.)
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import groupby
from typing import Final, Sequence, TypeAlias

# Redis refuses to recurse deeper than this many stars (util.c); patterns past it never match.
STAR_NESTING_LIMIT = 1000
_STAR: Final = None  # the token for a run of stars; every other token is a set of bytes (a `bytes` of 256 flags)

# The atoms a pattern compiles to. A table: 256 flags, 1 at each byte the token accepts.
Table: TypeAlias = bytes
# A token: a table, or None (_STAR) for a run of stars.
Token: TypeAlias = Table | None
# A segment (the tokens between two stars): its literal bytes, or one table per token.
SegmentTokens: TypeAlias = bytes | list[Table]


def _single(byte: int) -> bytes:
    table = bytearray(256)
    table[byte] = 1
    return bytes(table)


_ANY = b"\x01" * 256
_SINGLES = tuple(_single(byte) for byte in range(256))
_LITERAL_OF = {table: byte for byte, table in enumerate(_SINGLES)}
# A segment compiles to a regular expression up to this many atoms (Python's compiler takes
# tens of microseconds per atom); a longer one is matched token by token in Python.
REGEX_ATOMS = 256


def _tokens(pattern: bytes) -> list[Token]:
    """The pattern as tokens: _STAR, or a 256-byte table with 1 at the bytes the token accepts
    (shared between equal tokens, so a long pattern costs a reference per token)."""
    tokens: list[Token] = []
    sets: dict[Table, Table] = {}
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == 0x2A:  # '*'
            if not tokens or tokens[-1] is not _STAR:
                tokens.append(_STAR)
        elif ch == 0x3F:  # '?'
            tokens.append(_ANY)
        elif ch == 0x5B:  # '['
            i, accepted = _bracket(pattern, i + 1)
            tokens.append(sets.setdefault(accepted, accepted))
        else:
            if ch == 0x5C and i + 1 < n:  # '\\' escapes the next byte
                i += 1
                ch = pattern[i]
            tokens.append(_SINGLES[ch])
        i += 1
    return tokens


def _bracket(pattern: bytes, i: int) -> tuple[int, Table]:
    """The set starting at pattern[i] (just after '['): (index of its last byte, table)."""
    n = len(pattern)
    negate = i < n and pattern[i] == 0x5E  # '^'
    if negate:
        i += 1
    table = bytearray(256)
    while True:
        if i >= n:  # never closed: the set ends with the pattern
            i = n - 1
            break
        ch = pattern[i]
        if ch == 0x5C and i + 1 < n:  # an escaped byte
            i += 1
            table[pattern[i]] = 1
        elif ch == 0x5D:  # ']'
            break
        elif i + 2 < n and pattern[i + 1] == 0x2D:  # a range 'x-y' (three bytes left at least)
            # Redis compares C chars, which are signed: bytes past 0x7f sort below 0x00.
            low, high = sorted((_signed(ch), _signed(pattern[i + 2])))
            for value in range(low, high + 1):
                table[value & 0xFF] = 1
            i += 2
        else:
            table[ch] = 1
        i += 1
    if negate:
        table = bytearray(1 - flag for flag in table)
    return i, bytes(table)


def _signed(byte: int) -> int:
    return byte - 256 if byte > 0x7F else byte


class _Segment:
    """A run of one-byte tokens between stars: matched at a place or searched leftmost."""

    __slots__ = ("size", "literal", "regex", "tokens")

    def __init__(self, tokens: SegmentTokens) -> None:
        """`tokens`: the literal bytes, or one 256-byte table per token."""
        self.size = len(tokens)
        self.literal: bytes | None = None
        self.regex: re.Pattern[bytes] | None = None
        self.tokens: list[Table] = []
        if isinstance(tokens, bytes):
            self.literal = tokens
            return
        singles = [_LITERAL_OF.get(table, -1) for table in tokens]
        if -1 not in singles:
            self.literal = bytes(singles)
            return
        # A run of equal tokens is one atom repeated a fixed number of times: still no
        # choice to backtrack over, and far quicker to compile than the run itself.
        runs = [(table, sum(1 for _ in group)) for table, group in groupby(tokens)]
        if len(runs) > REGEX_ATOMS:
            self.tokens = tokens
            return
        atoms = [_atom(table) + (b"{%d}" % count if count > 1 else b"") for table, count in runs]
        self.regex = re.compile(b"".join(atoms), re.DOTALL)

    def match_at(self, key: bytes, pos: int) -> bool:
        if self.literal is not None:
            return key.startswith(self.literal, pos)
        if self.regex is not None:
            return self.regex.match(key, pos, pos + self.size) is not None
        return len(key) - pos >= self.size and all(
            table[byte] for table, byte in zip(self.tokens, key[pos : pos + self.size]))

    def search(self, key: bytes, start: int, end: int) -> int:
        """Leftmost position >= start where the segment fits before `end`, or -1."""
        if self.literal is not None:
            return key.find(self.literal, start, end)
        if self.regex is not None:
            found = self.regex.search(key, start, end)
            return -1 if found is None else found.start()
        for pos in range(start, end - self.size + 1):
            if self.match_at(key, pos):
                return pos
        return -1


def _atom(table: Table) -> bytes:
    """One token as a regular-expression atom matching exactly one byte."""
    count = table.count(1)
    if count == 256:
        return b"."
    if count == 0:
        return b"[^\\x00-\\xff]"
    runs, byte = [], 0
    while byte < 256:  # the accepted bytes as ranges: [\x61-\x7a] rather than 26 bytes
        if table[byte]:
            end = byte
            while end + 1 < 256 and table[end + 1]:
                end += 1
            runs.append(b"\\x%02x" % byte if end == byte else b"\\x%02x-\\x%02x" % (byte, end))
            byte = end
        byte += 1
    return b"[" + b"".join(runs) + b"]"


class Glob:
    """A compiled pattern; calling it with a key says whether the key matches."""

    __slots__ = ("pattern", "exact", "head", "middle", "tail", "min_len", "never", "cost_per_byte", "match")

    def __init__(self, pattern: bytes) -> None:
        self.pattern = pattern
        segments: Sequence[SegmentTokens]
        if b"?" in pattern or b"[" in pattern or b"\\" in pattern:
            tables: list[list[Table]] = [[]]
            for token in _tokens(pattern):
                if token is _STAR:
                    tables.append([])
                else:
                    tables[-1].append(token)
            segments = tables
        else:  # literals and stars only (most patterns): split at C speed, however long
            parts = pattern.split(b"*")
            segments = [parts[0], *(part for part in parts[1:-1] if part), parts[-1]] if len(parts) > 1 else parts
        stars = len(segments) - 1
        # Stars followed by a token: each is one level of Redis's recursion.
        self.never = stars - (0 if segments[-1] else 1) > STAR_NESTING_LIMIT
        if self.never:
            segments = [segments[0], segments[-1]]  # matches nothing: no need to build the rest
        self.exact = stars == 0  # no star: the one segment is the whole key
        self.head = _Segment(segments[0])
        self.tail = self.head if self.exact else _Segment(segments[-1])
        self.middle = [_Segment(segment) for segment in segments[1:-1]]
        self.min_len = sum(len(segment) for segment in segments)
        # An upper bound on the work per byte of key (used to slice KEYS): the tokens.
        self.cost_per_byte = max(1, self.min_len)
        self.match = (lambda key: False) if self.never else self._shortcut() or self._general

    def _shortcut(self):
        """A faster equal predicate for the common shapes: `*`, `lit`, `lit*`, `*lit`, `*lit*`."""
        head, tail, middle = self.head, self.tail, self.middle
        if self.exact:
            return (lambda key, lit=head.literal: key == lit) if head.literal is not None else None
        if any(part.literal is None for part in (head, tail, *middle)) or len(middle) > 1:
            return None
        if not head.size and not tail.size:
            if not middle:  # stars only: an empty key matches `*` alone
                return (lambda key: True) if self.pattern == b"*" else (lambda key: key != b"")
            return lambda key, lit=middle[0].literal: lit in key
        if middle:
            return None
        if not tail.size:
            return lambda key, lit=head.literal: key.startswith(lit)
        if not head.size:
            return lambda key, lit=tail.literal: key.endswith(lit)
        return None

    def __call__(self, key: bytes) -> bool:
        return self.match(key)

    def _general(self, key: bytes) -> bool:
        return self._match(key, None)

    def steps(self, key: bytes) -> tuple[bool, int]:
        """(match, byte comparisons it may take at most): the segments' sizes times the spans
        they were matched or searched over. Tests check this stays within pattern x key."""
        tally = [0]
        return self._match(key, tally), tally[0]

    def _match(self, key: bytes, tally: list[int] | None) -> bool:
        n = len(key)
        if n < self.min_len or self.never:
            return False
        if not n:  # Redis: an empty key matches only an empty pattern, or `*` alone
            return self.pattern in (b"", b"*")
        head, tail = self.head, self.tail
        if self.exact:
            if tally is not None:
                tally[0] += head.size
            return n == head.size and head.match_at(key, 0)
        if tally is not None:
            tally[0] += head.size + tail.size
        end = n - tail.size
        if not (head.match_at(key, 0) and tail.match_at(key, end)):
            return False
        pos = head.size
        for segment in self.middle:
            found = segment.search(key, pos, end)
            if tally is not None:
                tried = found - pos + 1 if found >= 0 else max(0, end - segment.size - pos + 1)
                tally[0] += tried * segment.size
            if found < 0:
                return False
            pos = found + segment.size
        return True


# Patterns up to this size are kept compiled (KEYS, SCAN and CONFIG GET repeat theirs).
CACHED_PATTERN_BYTES = 1024


@lru_cache(maxsize=256)
def _cached(pattern: bytes) -> Glob:
    return Glob(pattern)


def compile_glob(pattern: bytes) -> Glob:
    """The matcher for `pattern` (a callable: key -> bool), as Redis's stringmatchlen matches."""
    return _cached(pattern) if len(pattern) <= CACHED_PATTERN_BYTES else Glob(pattern)
