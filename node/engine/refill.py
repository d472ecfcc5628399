"""How often a slot freed while the batch goes on is taken again at once.

A batch that no request waits to join drains: it lasts as many steps as its slowest sequence
needs, and the planner weighs a kept token of a sequence that will finish first at its row
alone (node/speculative/draining.py). That holds where the batch's end is the end of the work
(requests sent together, answers awaited together). Clients that each send their next request
when they have their answer (a tagging script with four workers, an agent loop) fill a freed
slot within milliseconds: there a token kept by any sequence brings its client's next request
in sooner, and is worth a plain token's share of the step, as while requests wait.

The scheduler tells this class when a sequence ends while others go on decoding and nothing is
queued (an opening), when a request arrives (any thread), and when the batch empties. An
opening is taken by the first arrival within WINDOW seconds of it; it is not taken once the
window passes with none, or once the batch empties first (requests sent together, the next
round sent after the last answer). `share` is the part of the last MEMORY openings that were
taken, counted as taken / (openings + 1): a node that has never seen a freed slot taken weighs
its draining batches as before.
"""

from __future__ import annotations

import collections
import threading

WINDOW = 0.25   # seconds from a slot's freeing to the arrival that takes it (a client's round trip)
MEMORY = 32     # openings remembered


class Refill:
    def __init__(self, window: float = WINDOW, memory: int = MEMORY) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._open: collections.deque[float] = collections.deque()  # openings not yet decided, oldest first
        self._taken: collections.deque[bool] = collections.deque(maxlen=memory)

    def freed(self, now: float) -> None:
        """A sequence ended at `now` while others go on and none waits (engine thread)."""
        with self._lock:
            self._expire(now)
            self._open.append(now)

    def arrived(self, now: float) -> None:
        """A request arrived at `now` (any thread): it takes the oldest opening in the window."""
        with self._lock:
            self._expire(now)
            if self._open:
                self._open.popleft()
                self._taken.append(True)

    def emptied(self) -> None:
        """The batch has no sequence left: openings nobody took by now were not taken."""
        with self._lock:
            self._taken.extend(False for _ in self._open)
            self._open.clear()

    @property
    def share(self) -> float:
        """The part of the remembered openings that an arrival took, 0 before any was."""
        with self._lock:
            return sum(self._taken) / (len(self._taken) + 1)

    def _expire(self, now: float) -> None:
        while self._open and now - self._open[0] > self._window:
            self._open.popleft()
            self._taken.append(False)
