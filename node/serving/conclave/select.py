"""OpenAI's `best_of`: generate best_of candidates, return the n with the highest mean token
log-probability.

The candidates are the same forks the Conclave uses (one prefill, one group, seed + i), all
with the request's own sampling parameters, as OpenAI samples them. Log-probabilities are
computed for every candidate (the engine request asks for them even when the client did
not; they are dropped from the answer then). The mean is over the tokens the client sees
(an end-of-generation token, which is not shown, is not counted); a candidate with no
token ranks last. The n chosen are returned best first; ties go to the lower candidate.
"""

from __future__ import annotations

import asyncio
import math
from typing import Sequence

from node.serving.conclave.runner import Candidate


def mean_logprob(candidate: Candidate) -> float:
    values = [item.logprob for piece in candidate.pieces for item in piece.logprobs]
    return sum(values) / len(values) if values else -math.inf


def best(candidates: Sequence[Candidate], n: int) -> list[Candidate]:
    """The n completed candidates with the highest mean logprob, best first."""
    done = [c for c in candidates if c.completed]
    return sorted(done, key=lambda c: (-mean_logprob(c), c.number))[:n]


async def run_all(candidates: Sequence[Candidate]) -> None:
    """Consume every candidate to its end."""
    await asyncio.gather(*(c.consume() for c in candidates))
