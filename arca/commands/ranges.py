"""Commands over parts of a value: GETRANGE SUBSTR SETRANGE LCS.

Offsets follow Redis: negative GETRANGE offsets count from the end, SETRANGE pads with zero
bytes and keeps the TTL. A value may not grow past `proto-max-bulk-len` (Redis's message
names that limit) nor past the L1 budget (-OOM). LCS fills the whole length table (one
numpy pass per character of the shorter string) and walks it back from the end as Redis
does, so IDX reports the same ranges in the same order; the table may not need more
than `proto-max-bulk-len` bytes.
"""

from __future__ import annotations

import numpy as np

from arca.archive.archive import ENCODING_RAW
from arca.commands.args import NOT_INTEGER, SYNTAX, TOO_LONG, parse_int, value_size_limit
from arca.commands.registry import CommandContext, CommandError, command

_KEY = (1, 1, 1)

def slice_range(length: int, start: int, end: int) -> tuple[int, int]:
    """GETRANGE's [start, end) over a value of `length` bytes (empty when start >= end)."""
    if start < 0 and end < 0 and start > end:
        return 0, 0
    if start < 0:
        start = max(length + start, 0)
    if end < 0:
        end = max(length + end, 0)
    end = min(end, length - 1)
    if length == 0 or start > end:
        return 0, 0
    return start, end + 1


@command("GETRANGE", arity=4, flags=("readonly",), group="string", summary="A substring of a key's value", args="key start end", since="2.4.0", keys=_KEY)
def getrange(ctx: CommandContext, argv: list[bytes]):
    start, end = parse_int(argv[2]), parse_int(argv[3])
    value = ctx.archive.get(argv[1])
    if value is None:
        return b""
    lo, hi = slice_range(len(value), start, end)
    return value[lo:hi]


@command("SUBSTR", arity=4, flags=("readonly",), group="string", summary="A substring of a key's value (old name of GETRANGE)", args="key start end", keys=_KEY)
def substr(ctx: CommandContext, argv: list[bytes]):
    return getrange(ctx, argv)


@command("SETRANGE", arity=4, flags=("write", "denyoom"), group="string", summary="Overwrite part of a key's value at an offset", args="key offset value", since="2.2.0", keys=_KEY)
def setrange(ctx: CommandContext, argv: list[bytes]):
    offset = parse_int(argv[2])
    if offset < 0:
        raise CommandError("ERR offset is out of range")
    piece = argv[3]
    archive = ctx.archive
    found = archive.get_for_update(argv[1])
    if not piece:
        return 0 if found is None else len(found[0])
    if offset + len(piece) > value_size_limit(ctx):
        raise CommandError(TOO_LONG)
    old, deadline = (b"", None) if found is None else found
    if len(old) < offset:
        old += bytes(offset - len(old))
    value = old[:offset] + piece + old[offset + len(piece):]
    archive.put(argv[1], value, deadline)
    archive.set_encoding(argv[1], ENCODING_RAW)  # Redis modifies (or builds) a raw string
    return len(value)


# -- LCS ----------------------------------------------------------------------------------


def lcs_table(a: bytes, b: bytes) -> np.ndarray:
    """table[i, j] = length of the LCS of a[:i] and b[:j]."""
    if len(a) > len(b):
        return lcs_table(b, a).T  # the table is symmetric: loop over the shorter string
    table = np.zeros((len(a) + 1, len(b) + 1), dtype=np.uint32)
    columns = np.frombuffer(b, dtype=np.uint8)
    for i, byte in enumerate(a, 1):
        above = table[i - 1]
        # With a match the diagonal plus one; the row's running maximum then carries the
        # left neighbour (a match's diagonal + 1 is never below its neighbours).
        best = above.copy()
        np.maximum(above[1:], np.where(columns == byte, above[:-1] + 1, 0), out=best[1:])
        np.maximum.accumulate(best, out=table[i])
    return table


def walk_back(a: bytes, b: bytes, table: np.ndarray, min_len: int, skip_after: int = 16) -> tuple[bytes, list]:
    """The LCS and its matching ranges, walked from the ends of both strings: on a tie the
    walk steps back in b. Ranges are ((a_start, a_end), (b_start, b_end), length), last first.
    After `skip_after` steps in one direction the walk finds the end of the run with numpy
    (a long value against a short one would walk millions of cells one by one)."""
    a_bytes, b_bytes = np.frombuffer(a, dtype=np.uint8), np.frombuffer(b, dtype=np.uint8)
    i, j = len(a), len(b)
    common = bytearray()
    matches = []
    run = None  # [a_start, a_end, b_start, b_end] of the match being extended backwards
    streak = 0  # consecutive steps back in the same direction
    while i > 0 and j > 0:
        if a[i - 1] == b[j - 1]:
            common.append(a[i - 1])
            i -= 1
            j -= 1
            streak = 0
            if run is None:
                run = [i, i, j, j]
            else:
                run[0], run[2] = i, j
            ended = i == 0 or j == 0
        else:
            up = table[i - 1, j] > table[i, j - 1]
            if up:
                i -= 1
                streak = streak + 1 if streak > 0 else 1
            else:
                j -= 1
                streak = streak - 1 if streak < 0 else -1
            if streak >= skip_after and i > 0 and j > 0:
                i = _skip_up(a_bytes, b[j - 1], table, i, j)
            elif streak <= -skip_after and i > 0 and j > 0:
                j = _skip_left(b_bytes, a[i - 1], table, i, j)
            ended = run is not None
        if ended and run is not None:
            length = run[1] - run[0] + 1
            if length >= min_len:
                matches.append(((run[0], run[1]), (run[2], run[3]), length))
            run = None
    common.reverse()
    return bytes(common), matches


def _skip_up(a_bytes: np.ndarray, byte: int, table: np.ndarray, i: int, j: int) -> int:
    """The row where steps up from (i, j) stop: the highest k <= i with a match at (k, j) or
    no step up from it (0 when the walk leaves the table)."""
    width = 64
    while i > 0:
        low = max(i - width, 0)
        moves = (a_bytes[low:i] != byte) & (table[low:i, j] > table[low + 1:i + 1, j - 1])
        stops = np.flatnonzero(~moves)
        if stops.size:
            return low + 1 + int(stops[-1])
        i, width = low, width * 2
    return 0


def _skip_left(b_bytes: np.ndarray, byte: int, table: np.ndarray, i: int, j: int) -> int:
    """The column where steps left from (i, j) stop (see _skip_up; a tie steps left)."""
    width = 64
    while j > 0:
        low = max(j - width, 0)
        moves = (b_bytes[low:j] != byte) & (table[i - 1, low + 1:j + 1] <= table[i, low:j])
        stops = np.flatnonzero(~moves)
        if stops.size:
            return low + 1 + int(stops[-1])
        j, width = low, width * 2
    return 0


@command("LCS", arity=-3, flags=("readonly",), group="string", summary="The longest common subsequence of two values", args="key1 key2 [LEN] [IDX] [MINMATCHLEN min-match-len] [WITHMATCHLEN]", since="7.0.0", keys=(1, 2, 1))
def lcs(ctx: CommandContext, argv: list[bytes]):
    want_len = want_idx = with_len = False
    min_len = 0
    i = 3
    while i < len(argv):
        option = argv[i].upper()
        if option == b"LEN":
            want_len = True
        elif option == b"IDX":
            want_idx = True
        elif option == b"WITHMATCHLEN":
            with_len = True
        elif option == b"MINMATCHLEN" and i + 1 < len(argv):
            min_len = max(parse_int(argv[i + 1], NOT_INTEGER), 0)
            i += 1
        else:
            raise CommandError(SYNTAX)
        i += 1
    a = ctx.archive.get(argv[1]) or b""
    b = ctx.archive.get(argv[2]) or b""
    if want_len and want_idx:
        raise CommandError("ERR If you want both the length and indexes, please just use IDX.")
    if (len(a) + 1) * (len(b) + 1) * 4 > value_size_limit(ctx):
        raise CommandError("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
    table = lcs_table(a, b)
    total = int(table[len(a), len(b)])
    if want_len:
        return total
    common, matches = walk_back(a, b, table, min_len)
    if not want_idx:
        return common
    found = []
    for a_range, b_range, length in matches:
        item = [list(a_range), list(b_range)]
        if with_len:
            item.append(length)
        found.append(item)
    return {b"matches": found, b"len": total}
