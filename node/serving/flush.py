"""The graceful stop's last duty: what this node computed reaches the archive before it exits.

`flush_pending(service, timeout_s)` waits, within one bound, for the answers (L1) and corpus
observations (L4) still being written, and for the prefix states (L3) that the cache's writer
still holds or the fleet tier is still pushing; it logs what it flushed and how long that
took, or what it left behind when the bound ran out. The node's shutdown (node/api/app.py)
calls it once the last request has finished, before the fleet tier, the engine and the
archive close (which drop whatever is still pending).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Coroutine

if TYPE_CHECKING:
    from node.serving.service import CompletionService

log = logging.getLogger(__name__)


def _pending_states(service: CompletionService) -> int:
    fleet, cache = service.fleet, service.cache
    return (fleet.pending if fleet is not None else 0) + (cache.pending if cache is not None else 0)


async def flush_pending(service: CompletionService, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the pending archive writes and prefix states; True when
    nothing was left behind."""
    started = time.monotonic()
    writes, states = service.pending_writes, _pending_states(service)
    if not writes and not states:
        log.info("shutdown: no archive writes pending")
        return True
    log.info("shutdown: flushing %d archive writes (L1, L4) and %d prefix states (L3), at most %.1f s",
             writes, states, timeout_s)
    jobs: list[Coroutine[Any, Any, object]] = [service.drain(timeout_s)]
    if service.fleet is not None:
        jobs.append(service.fleet.flush(timeout_s))
    await asyncio.gather(*jobs)
    elapsed = time.monotonic() - started
    left_writes, left_states = service.pending_writes, _pending_states(service)
    if left_writes or left_states:
        log.warning("shutdown: %d archive writes and %d prefix states still pending after %.2f s "
                    "([server] shutdown_flush_s = %.1f): dropped", left_writes, left_states, elapsed, timeout_s)
        return False
    log.info("shutdown: flushed %d archive writes and %d prefix states in %.2f s", writes, states, elapsed)
    return True
