"""Counters of the prefix cache, shared by its tiers and read by /metrics.

A lookup walks a funnel: RAM serves it, or disk does, or it misses; states fetched from the
fleet (ARCA L3) ahead of a request are counted when fetched. Counters only grow; `snapshot`
returns a plain dict so the API can export each as a Prometheus counter or gauge.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class CacheCounters:
    lookups: int = 0
    ram_hits: int = 0
    ram_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    disk_preloads: int = 0  # disk reads moved off the engine thread (then a RAM hit)
    fleet_hits: int = 0
    fleet_misses: int = 0
    fleet_errors: int = 0
    fleet_timeouts: int = 0  # prefetches given up (the request prefilled instead)
    fleet_bytes_fetched: int = 0
    fleet_fetch_seconds: float = 0.0  # fetching fleet states' parts from the archive
    fleet_verify_seconds: float = 0.0  # verifying and assembling them
    fleet_pushes: int = 0
    fleet_bytes_pushed: int = 0
    fleet_pushes_dropped: int = 0
    exact_hits: int = 0  # restores to the token (node/cache/forks.py): a fork state, or a state cut; in ram_hits too
    exact_stores: int = 0  # exact fork states stored (RAM only), counted in stores too
    tokens_restored: int = 0
    tokens_prefilled: int = 0
    restore_seconds: float = 0.0
    stores: int = 0
    stores_dropped: int = 0
    bytes_stored_ram: int = 0
    bytes_stored_disk: int = 0
    disk_write_errors: int = 0


@dataclass(slots=True)
class CacheMetrics:
    """Thread-safe increments over `CacheCounters`."""

    counters: CacheCounters = field(default_factory=CacheCounters)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + delta)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self.counters, f.name) for f in fields(self.counters)}
