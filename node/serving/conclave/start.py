"""How a Conclave starts under adaptive starting: its first candidates, or all N at once,
learned from the node's Conclaves before it.

Adaptive starting (runner.py) runs an absolute majority of N first and the rest only once those
cannot agree. Where they usually agree, that saves the rest's rows. Where they seldom do, the
rest start only after the first ones have run for a while, and the Conclave takes two rounds of
decoding where one batch would do: on new invoices with 48-token answers, 2.59x the time of one
answer against 2.01x with all five started together (docs/BENCHMARKS.md).

So the node keeps, per N, whether each of its last WINDOW Conclaves needed its rest: whether its
first majority(N) candidates failed to all give the winning answer. While NEEDED_SHARE of them
or more did (and at least MIN_SEEN are known), a new Conclave starts all N at once. A Conclave
started whole still shows whether its first candidates would have been enough (those it stopped
early count as agreeing: they might have), so the record follows the workload both ways, and
a few agreeing Conclaves bring adaptive starting back.

Which candidates run never changes the answer a vote settles on where one answer holds a
majority of N, only which of the agreeing candidates' texts is returned (the lowest-numbered
one finished when the majority came). Owned by the serving layer, read and written on its
event loop.
"""

from __future__ import annotations

import collections
import logging
from typing import Mapping

from node.serving.conclave.vote import Verdict, majority

log = logging.getLogger(__name__)

WINDOW = 8            # Conclaves of one N remembered
MIN_SEEN = 4          # remembered before the record decides anything
NEEDED_SHARE = 0.5    # of those, the share that needed their rest for all N to start at once


def first_sufficed(verdict: Verdict, keys: Mapping[int, str | None], n: int, first: int) -> bool:
    """Whether a Conclave of n candidates would have been decided by its `first` candidates
    alone: they can make a majority of n, a majority won, and none of them gave another answer
    (`keys`: the completed candidates' answer keys, None for prose; one missing from `keys`,
    stopped unfinished or failed, is not held against them)."""
    if verdict.method != "majority" or first < majority(n):
        return False
    winning = keys.get(verdict.winner)
    return all(keys[number] == winning for number in range(first) if number in keys)


class StartRecord:
    """Per N, whether the node's recent Conclaves needed more than their first candidates."""

    def __init__(self, window: int = WINDOW, min_seen: int = MIN_SEEN, share: float = NEEDED_SHARE) -> None:
        if window < 1 or not 1 <= min_seen <= window or not 0.0 < share <= 1.0:
            raise ValueError("window >= 1, 1 <= min_seen <= window and 0 < share <= 1")
        self.window, self.min_seen, self.share = window, min_seen, share
        self._needed: dict[int, collections.deque[bool]] = {}

    def all_at_once(self, n: int) -> bool:
        """Whether a Conclave of n starts every candidate at once."""
        seen = self._needed.get(n)
        return seen is not None and len(seen) >= self.min_seen and sum(seen) >= self.share * len(seen)

    def record(self, n: int, needed: bool, first: int) -> None:
        """A decided Conclave of n: whether it needed more than its `first` candidates."""
        before = self.all_at_once(n)
        self._needed.setdefault(n, collections.deque(maxlen=self.window)).append(needed)
        after = self.all_at_once(n)
        if after != before:
            seen = self._needed[n]
            log.info("conclave of %d: %d of the last %d needed more than their first %d candidates; "
                     "they start %s", n, sum(seen), len(seen), first,
                     f"all {n} at once" if after else f"{first} first again")

    def snapshot(self) -> dict[int, dict[str, object]]:
        """Per N: the Conclaves remembered, how many needed their rest, how the next one starts."""
        return {n: {"seen": len(seen), "needed_rest": sum(seen), "all_at_once": self.all_at_once(n)}
                for n, seen in self._needed.items()}
