"""A Conclave's or a best_of's answer as the service's choice events, once it is decided.

Nothing of any candidate is sent before the decision: the winner (or the n best of best_of)
is then replayed piece by piece, exactly as it streamed from the engine, followed by its
`ChoiceDone` (carrying the Conclave's verdict). A stream therefore never shows a loser's
text; its first byte costs the time to the decision instead of one token (with an absolute
majority: about the time of the slowest of the first majority of candidates).

A completed answer goes to `jobs.finish()` (node/serving/jobs.py) like any other: the ledger
serves the tokens the client received; L1 remembers a deterministic request's answer with its
verdict, L4 the returned choices' tokens; every candidate's generated tokens count in the
node's generated-token metric.
"""

from __future__ import annotations

from typing import AsyncIterator, Sequence

from node.engine.types import GenerationHandle
from node.serving.conclave.runner import Candidate, ConclaveRun
from node.serving.conclave.select import best, run_all
from node.serving.errors import generation_failure
from node.serving.jobs import Jobs
from node.serving.l1 import Piece, StoredChoice
from node.serving.plan import ChoiceDone, ChoiceEvent, ChoiceText, Job


def _replay(index: int, candidate: Candidate, logprobs: bool) -> list[ChoiceEvent]:
    events: list[ChoiceEvent] = [ChoiceText(index, piece.text, piece.logprobs if logprobs else ())
                                 for piece in candidate.pieces]
    return events


def _stored(candidate: Candidate, logprobs: bool) -> StoredChoice:
    assert candidate.finished is not None
    pieces = tuple(piece if logprobs else Piece(piece.text) for piece in candidate.pieces)
    return StoredChoice(pieces, candidate.finished.reason, candidate.finished.completion_tokens,
                        candidate.finished.stop_sequence)


def _cached(candidates: Sequence[Candidate]) -> int:
    """The prompt tokens the group did not compute: what its prefill restored (the forks copy it)."""
    return max((c.finished.cached_tokens for c in candidates if c.finished is not None), default=0)


def _generated(candidates: Sequence[Candidate]) -> int:
    """Every candidate's generated tokens (the losers' too: the node computed them)."""
    return sum(c.finished.completion_tokens for c in candidates if c.finished is not None)


async def conclave_events(jobs: Jobs, job: Job, run: ConclaveRun) -> AsyncIterator[ChoiceEvent]:
    outcome = await run.decide()
    tokens = _generated(run.candidates)
    jobs.metrics.conclave_outcome(outcome)
    winner = outcome.winner
    assert winner.finished is not None
    logprobs = job.request.logprobs is not None
    for event in _replay(job.first_choice, winner, logprobs):
        yield event
    consensus = {**outcome.summary(), "generated_tokens": tokens}
    yield ChoiceDone(job.first_choice, winner.finished.reason, winner.finished.completion_tokens, consensus,
                     _cached(run.candidates), winner.finished.stop_sequence)
    jobs.finish(job, [_stored(winner, logprobs)], [tuple(winner.finished.generated)], computed=tokens,
                consensus=consensus)


async def best_of_events(jobs: Jobs, job: Job, handles: Sequence[GenerationHandle],
                         logprobs: bool) -> AsyncIterator[ChoiceEvent]:
    """`logprobs`: whether the client asked for them (the candidates always compute them)."""
    candidates = [Candidate(number, handle) for number, handle in enumerate(handles)]
    await run_all(candidates)
    cached = _cached(candidates)
    chosen = best(candidates, job.n)
    if len(chosen) < job.n:
        failed = next((c.finished for c in candidates if not c.completed and c.finished is not None), None)
        raise generation_failure(failed.reason if failed else "failed", failed.error if failed else None,
                                 failed.retry_after_s if failed else 0)
    for offset, candidate in enumerate(chosen):
        assert candidate.finished is not None
        for event in _replay(job.first_choice + offset, candidate, logprobs):
            yield event
        yield ChoiceDone(job.first_choice + offset, candidate.finished.reason, candidate.finished.completion_tokens,
                         cached_tokens=cached if offset == 0 else 0,
                         stop_sequence=candidate.finished.stop_sequence)
    jobs.finish(job, [_stored(c, logprobs) for c in chosen],
                [tuple(c.finished.generated) for c in chosen if c.finished is not None], computed=_generated(candidates))
