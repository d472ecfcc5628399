"""Watched L1 keys (WATCH before MULTI/EXEC): which watchers saw one of their keys change.

Every change to an L1 key (a write, a deletion, a new deadline, expiry, eviction; from
Python or from the table's plain path in C) lists the key in the table's `dirty` list the
first time the key changes after a commit. So a key that is not listed when it is watched
shows up in the list's tail at its next change. `Watches` keeps the position up to which it
has read that list, reads the tail before every commit empties it (`before_clear`) and
whenever a watcher asks (`changed`), and marks the watchers of every key it finds there.
Watching a key that is already listed needs a commit first (`needs_commit`): its next
change would not be listed again.
"""

from __future__ import annotations

from typing import Any, Iterable


class Watcher:
    """One connection's watched keys; `changed` once any of them changed after WATCH."""

    __slots__ = ("keys", "changed")

    def __init__(self) -> None:
        self.keys: set[bytes] = set()
        self.changed = False


class Watches:
    def __init__(self, table: Any) -> None:
        self._table = table
        self._by_key: dict[bytes, set[Watcher]] = {}
        self._seen = 0  # dirty-list entries already looked at
        self._listed: set[bytes] = set()  # dirty[:self._listed_upto] as a set, for needs_commit
        self._listed_upto = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def needs_commit(self, keys: Iterable[bytes]) -> bool:
        """Whether one of `keys` is in the dirty list already (changed since the last commit)."""
        dirty = self._table.dirty
        if not dirty:
            return False
        if len(dirty) < self._listed_upto:  # emptied without telling us
            self._forget_listed()
        self._listed.update(dirty[self._listed_upto:])  # the list only grows until a commit
        self._listed_upto = len(dirty)
        return any(key in self._listed for key in keys)

    def _forget_listed(self) -> None:
        self._listed.clear()
        self._listed_upto = 0

    def add(self, watcher: Watcher, keys: Iterable[bytes]) -> None:
        self._read_tail()  # earlier changes are not this watcher's business
        for key in keys:
            watcher.keys.add(key)
            self._by_key.setdefault(key, set()).add(watcher)

    def remove(self, watcher: Watcher) -> None:
        for key in watcher.keys:
            watchers = self._by_key.get(key)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._by_key[key]
        watcher.keys.clear()

    def changed(self, watcher: Watcher) -> bool:
        """Whether a watched key changed; a key whose deadline has passed counts as changed."""
        contains = self._table.contains
        for key in watcher.keys:
            contains(key)  # expires a key past its deadline, which lists it as dirty
        self._read_tail()
        return watcher.changed

    def before_clear(self) -> None:
        """The dirty list is about to be emptied (a commit): read what it still holds."""
        self._read_tail()
        self._seen = 0
        self._forget_listed()

    def flushing(self) -> None:
        """Every key is about to go: the watchers of keys that exist see a change."""
        self._read_tail()
        contains = self._table.contains
        for key, watchers in self._by_key.items():
            if contains(key):
                for watcher in watchers:
                    watcher.changed = True
        self._seen = 0
        self._forget_listed()

    def _read_tail(self) -> None:
        dirty = self._table.dirty
        if len(dirty) < self._seen:  # emptied without telling us: read it all again
            self._seen = 0
        if self._by_key and len(dirty) > self._seen:
            by_key = self._by_key
            for key in dirty[self._seen:]:
                watchers = by_key.get(key)
                if watchers:
                    for watcher in watchers:
                        watcher.changed = True
        self._seen = len(dirty)
