"""Time for L1 deadlines: absolute unix milliseconds.

Active expiry itself lives in the L1 table (arca/archive/_l1table.c): a heap of (deadline,
slot) pairs, 16 bytes per deadline set, so a key with a TTL costs no Python object.
`Entries.expire_due` runs it.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
