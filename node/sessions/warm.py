"""Warm-ahead: prefill a prompt into the prefix cache before anyone asks, and say what it did.

`warm(submit, cache, tokens)` fetches what the fleet already holds (when a fleet tier is
given), then runs the prompt through the engine with one greedy output token, which makes
the engine store the prompt's last block boundary (and any fork point or checkpoint the
cache's policy picks). Every later prompt that starts with these tokens restores that state
and prefills only what follows it. The API's `POST /v1/warm`, session loads and `reame warm`
all come here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from node.cache.fleet import FleetTier
from node.cache.prefix_cache import PrefixCache
from node.engine.errors import EngineError
from node.engine.types import COMPLETED, Finished, GenerationHandle, GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class WarmFailed(EngineError):
    """The engine ended the warm-up without completing it (cancelled, failed, or no room came
    free within the queue's wait bound: then retry after `retry_after_s`)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class WarmResult:
    tokens: int  # prompt tokens warmed
    cached_tokens: int  # of them, already held by the cache before (restored, not prefilled)
    stored_tokens: int  # the longest prefix of the prompt the cache holds afterwards
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "cached_tokens": self.cached_tokens,
                "stored_tokens": self.stored_tokens, "seconds": round(self.seconds, 4)}


def held_tokens(cache: PrefixCache, tokens: Sequence[int], scope: str = "") -> int:
    """The longest restorable prefix of `tokens` the local tiers hold (RAM, queued or disk) for
    the tenant's `scope`."""
    return cache.longest_local(cache.chain.restorable(tokens, scope))


async def warm(submit: Callable[[GenerationRequest], GenerationHandle], cache: PrefixCache,
               tokens: Sequence[int], *, fleet: FleetTier | None = None, prefetch_timeout_s: float = 2.0,
               max_wait_s: float = 0.0, scope: str = "") -> WarmResult:
    """Prefill `tokens` through the engine so the cache stores them (module docstring), under
    the tenant's `scope`.

    `submit` hands the request to the engine (the service maps engine errors to its own there).
    """
    started = time.perf_counter()
    if fleet is not None:
        await fleet.prefetch_within(tokens, prefetch_timeout_s, scope)
    cached = held_tokens(cache, tokens, scope)
    request = GenerationRequest(prompt_tokens=tuple(tokens), max_tokens=1, sampling=GREEDY, max_wait_s=max_wait_s,
                                cache_scope=scope)
    handle = submit(request)
    finished: Finished | None = None
    try:
        async for event in handle:
            if isinstance(event, Finished):
                finished = event
    finally:
        handle.cancel()
    if finished is not None and finished.retry_after_s > 0:
        raise WarmFailed(f"warming {len(tokens)} tokens never started: {finished.error}", finished.retry_after_s)
    if finished is None or finished.reason not in COMPLETED:
        detail = finished.error if finished is not None and finished.error else "no detail"
        raise WarmFailed(f"warming {len(tokens)} tokens ended early: {detail}")
    return WarmResult(len(tokens), cached, held_tokens(cache, tokens, scope), time.perf_counter() - started)
