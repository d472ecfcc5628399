"""A circuit breaker for the remote archive: stop asking a dead server, notice when it is back.

Closed: every call goes through. A connection failure or timeout opens the breaker: calls
are answered as misses at once (no socket, no waiting) and a watcher task probes ARCA with
backoff (0.25 s doubling to 10 s). The first successful probe or call closes it again. The
transition to open is logged once as a warning and the transition back once as info, so a
long outage writes two lines, not one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.25
MAX_BACKOFF_S = 10.0


class Breaker:
    """closed -> (failure) -> open -> (backoff) -> probing -> closed, or open with longer backoff."""

    def __init__(self, name: str, *, initial_backoff_s: float = INITIAL_BACKOFF_S,
                 max_backoff_s: float = MAX_BACKOFF_S) -> None:
        self.name = name
        self.state = "closed"
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.backoff_s = initial_backoff_s
        self.opened_at = 0.0
        self._wake = asyncio.Event()
        self._watcher: asyncio.Task | None = None

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    def failed(self, exc: BaseException) -> None:
        if self.state == "closed":
            self.state = "open"
            self.opened_at = time.monotonic()
            self.backoff_s = self.initial_backoff_s
            log.warning("archive %s unreachable (%s): serving without it until it is back",
                        self.name, str(exc) or type(exc).__name__)
            self._wake.set()
        elif self.state == "probing":  # failures of calls already in flight do not count twice
            self.state = "open"
            self.backoff_s = min(self.backoff_s * 2, self.max_backoff_s)

    def succeeded(self) -> None:
        if self.state != "closed":
            self.state = "closed"
            log.info("archive %s is back after %.1f s", self.name, time.monotonic() - self.opened_at)

    def retire(self, reason: str) -> None:
        """Close for good: the server it guarded no longer holds any of the keys (a failover)."""
        if self.state != "closed":
            self.state = "closed"
            log.info("archive %s: %s after %.1f s", self.name, reason, time.monotonic() - self.opened_at)

    def start_watching(self, probe: Callable[[], Awaitable[object]]) -> None:
        """Run `probe` (which reports to failed()/succeeded()) with backoff while open."""
        if self._watcher is None:
            if not self.closed:
                self._wake.set()
            self._watcher = asyncio.create_task(self._watch(probe), name=f"arca-breaker-{self.name}")

    async def _watch(self, probe: Callable[[], Awaitable[object]]) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.state == "open":
                await asyncio.sleep(self.backoff_s)
                if self.state == "open":
                    self.state = "probing"
                    await probe()

    async def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
