"""What the node served, counted where answers leave the service: tokens, the part of them
replayed from L1, and how long the node was busy answering.

`Answer` (node/serving/answer.py) records into the jobs' ledger (node/serving/jobs.py):
`enter()` and `leave()` around every plan (busy time is the wall time with at least one
answer in flight, L1 hits and batch lines included) and, through `Jobs.replayed` and
`Jobs.finish`, `served()` once per job whose choices all ended, plain, Conclave and best_of
alike (a failed or cancelled job served nothing); embeddings (node/serving/embeddings.py) record `embedded()`
once per answer, their inputs as prompt tokens, the ones found in L1 as L1 tokens. Counters only grow; node/serving/savings.py samples them.
Touched on the event loop only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(slots=True)
class Ledger:
    clock: Callable[[], float] = field(default=time.monotonic)
    answers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    l1_answers: int = 0
    l1_tokens: int = 0        # prompt + completion tokens of answers replayed from L1
    _busy_s: float = 0.0
    _in_flight: int = 0
    _busy_since: float = 0.0

    def enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = self.clock()
        self._in_flight += 1

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._busy_s += self.clock() - self._busy_since

    @property
    def busy_s(self) -> float:
        """Seconds with at least one answer in flight, the running stretch included."""
        running = self.clock() - self._busy_since if self._in_flight else 0.0
        return self._busy_s + running

    def served(self, prompt_tokens: int, completion_tokens: int, *, from_l1: bool) -> None:
        self.answers += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if from_l1:
            self.l1_answers += 1
            self.l1_tokens += prompt_tokens + completion_tokens

    def embedded(self, prompt_tokens: int, cached_tokens: int, *, all_cached: bool) -> None:
        """One embedding answer: its inputs' tokens, `cached_tokens` of them answered from L1."""
        self.answers += 1
        self.prompt_tokens += prompt_tokens
        self.l1_tokens += cached_tokens
        if all_cached:
            self.l1_answers += 1

    def snapshot(self) -> dict[str, float]:
        return {"answers": self.answers, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "l1_answers": self.l1_answers,
                "l1_tokens": self.l1_tokens, "busy_s": self.busy_s}
