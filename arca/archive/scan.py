"""SCAN cursors that stay complete while keys are written, read, evicted and deleted.

A scan starting at cursor 0 takes a snapshot of the key list (the L1 table's `snapshot()`,
8 bytes per key, or any sequence of keys whose slices are lists); the cursor encodes (snapshot id << 32) | position in it. Every key present from the start to
the end of a full iteration is returned (keys deleted meanwhile are filtered out; keys
added meanwhile may or may not appear, as in Redis). At most `keep` snapshots are held; a
cursor whose snapshot was dropped (or that comes from before a restart) restarts on a fresh
snapshot at the same position, which may repeat or miss keys that changed meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Protocol

_POSITION_BITS = 32


class KeySnapshot(Protocol):
    """The keys at one moment, read back in slices: a list, or the L1 table's snapshot
    (whose slices hold the keys still live)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice, /) -> list[bytes]: ...


class ScanCursors:
    def __init__(self, keep: int = 16) -> None:
        self._keep = keep
        self._snapshots: OrderedDict[int, KeySnapshot] = OrderedDict()
        self._next_id = 1

    def page(self, cursor: int, count: int, snapshot_keys: Callable[[], KeySnapshot],
             is_live: Callable[[bytes], bool]) -> tuple[int, list[bytes]]:
        if cursor < 0:
            raise ValueError("cursor must be >= 0")
        snapshot_id, position = cursor >> _POSITION_BITS, cursor & ((1 << _POSITION_BITS) - 1)
        snapshot = self._snapshots.get(snapshot_id) if cursor else None
        if snapshot is None:
            snapshot_id, snapshot = self._take(snapshot_keys())
        else:
            self._snapshots.move_to_end(snapshot_id)
        end = position + max(1, count)
        keys = [key for key in snapshot[position:end] if is_live(key)]
        if end >= len(snapshot):
            self._snapshots.pop(snapshot_id, None)
            return 0, keys
        return (snapshot_id << _POSITION_BITS) | end, keys

    def _take(self, keys: KeySnapshot) -> tuple[int, KeySnapshot]:
        snapshot_id = self._next_id
        self._next_id += 1
        self._snapshots[snapshot_id] = keys
        while len(self._snapshots) > self._keep:
            self._snapshots.popitem(last=False)
        return snapshot_id, keys

    def clear(self) -> None:
        self._snapshots.clear()
