"""Per-group state of a draft source: made when a group's first member begins, kept while any
member is live, and for the last `retained` ended groups, for members that join later (a
Conclave's candidates started once the first ones disagreed)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, TypeVar

from node.engine.hooks import DraftSeq

G = TypeVar("G")


class GroupStates(Generic[G]):
    def __init__(self, make: Callable[[DraftSeq], G], retained: int) -> None:
        self._make = make
        self._retained = retained
        self.live: dict[int, G] = {}
        self.ended: OrderedDict[int, G] = OrderedDict()  # groups without a live member, oldest first
        self._members: dict[int, int] = {}

    def begin(self, seq: DraftSeq) -> G:
        """The state of seq's group (an ended one taken back), counting seq as a live member."""
        state = self.live.get(seq.group)
        if state is None:
            state = self.ended.pop(seq.group) if seq.group in self.ended else self._make(seq)
            self.live[seq.group] = state
        self._members[seq.group] = self._members.get(seq.group, 0) + 1
        return state

    def end(self, seq: DraftSeq) -> None:
        """seq left its group; the group's last member leaving moves it to the ended ones."""
        left = self._members.get(seq.group, 0) - 1
        if seq.group not in self.live:
            return
        if left > 0:
            self._members[seq.group] = left
            return
        self._members.pop(seq.group, None)
        self.ended[seq.group] = self.live.pop(seq.group)
        while len(self.ended) > self._retained:
            self.ended.popitem(last=False)
