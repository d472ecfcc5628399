"""Batch work on the event loop yields to live requests, as the engine's priority classes do on its thread.

The engine admits interactive requests first and lets batch sequences carry at most one token
beside live decoding (node/engine/scheduler.py), but a batch line does much of its work on the
event loop, where no priority applies: parsing its body, rendering and tokenizing its prompt, the
L1 lookup and the replay of a stored answer, shaping the response. A batch of lines answered
from L1 never reaches the engine and would take the loop from live requests line after line.

`LiveFirst` counts the live requests being answered (`enter()` and `leave()`, or `with
live_first.live():`, around each);
`await live_first.batch_turn()` is where a batch line waits before its work. With no live
request it returns at once; otherwise the lines go one at a time, at most one every
`interval_s` (and at once when the last live request ends), in arrival order: a replaying batch
takes at most one line's loop work per interval from live traffic, and still moves under a
steady stream of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Iterator

BATCH_INTERVAL_S = 0.05  # while live requests are answered: at most one batch line per this


class LiveFirst:
    def __init__(self, interval_s: float = BATCH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.active = 0  # live requests being answered
        self.waited = 0  # batch lines that found live work and waited for their turn
        self._idle = asyncio.Event()
        self._idle.set()
        self._turn = asyncio.Lock()
        self._last = -math.inf  # when the last batch line went through while live work was on

    def enter(self) -> None:
        """A live request is being answered."""
        self.active += 1
        self._idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if not self.active:
            self._idle.set()

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """Around the answering of one live request."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    async def batch_turn(self) -> None:
        """Return when a batch line may do its work (module docstring)."""
        if not self.active:
            return
        self.waited += 1
        async with self._turn:
            while self.active:
                wait = self._last + self.interval_s - time.monotonic()
                if wait <= 0:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), wait)
            if self.active:
                self._last = time.monotonic()
