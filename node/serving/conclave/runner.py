"""Running a Conclave: the candidates on the engine, the vote as they finish, losers stopped.

Candidate 0 is the request unchanged (a greedy request stays greedy, so the Conclave's answer
is the plain answer whenever the vote does not overrule it); candidate i > 0 (an explorer)
samples with seed + i (the request's seed, else `ConclavePolicy.seed`, so a Conclave over a
greedy request is reproducible and cacheable) at a temperature of at least
`explore_temperature`. All of them are one group in the engine: one prefill, forks of it
(`llama_memory_seq_cp`), decoded in the one interleaved batch with every other user, and
drafting for each other (the prompt-lookup source shares its index within a group).

Adaptive start (`adaptive`): only `initial` candidates start (default: an absolute majority
of N, 3 of 5), with KV reserved for all N. When the finished and running candidates can no
longer make an absolute majority (the leading answer's votes + the candidates still running
< N // 2 + 1), every remaining candidate starts at once; a candidate started while a sibling
still holds the prompt in the KV clones it (one token of prefill), otherwise it prefills
again (the prefix cache restoring what it holds). When the first candidates agree, the rest
never run. Where half or more of the node's recent Conclaves of this N needed their rest, a new one
starts all N at once instead (start.py, `StartRecord`): two rounds of decoding become one.

Every time a candidate finishes, the vote (vote.py) is taken: an absolute majority of N, or a
plurality that no answers of the candidates still running or not started could change
(`settled`), stops the others at once (cancelled mid-generation; the engine frees their slots
and KV at its next step, and the run waits for that before it returns). Otherwise, once no
candidate is left, the plurality with at least 2 votes or the ROUGE-L medoid decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.config import ConclaveSettings
from node.engine.errors import EngineError
from node.engine.types import COMPLETED, Finished, GenerationHandle, GenerationRequest, TextDelta
from node.serving.conclave.start import StartRecord, first_sufficed
from node.serving.conclave.vote import Verdict, answer_key, decide, early, majority, settled, tally, votes_of
from node.serving.errors import GenerationFailed, ServingError, generation_failure
from node.serving.l1 import Piece

log = logging.getLogger(__name__)

SEED_SPACE = 2**64
CANCEL_WAIT_S = 30.0  # the engine applies a cancel at its next step; a loaded machine has slow steps

# submit(requests, spare, group) -> handles; raises the serving layer's errors
Submit = Callable[[Sequence[GenerationRequest], int, "int | None"], Sequence[GenerationHandle]]


@dataclass(frozen=True, slots=True)
class ConclavePolicy:
    max_candidates: int = 16          # the largest N a request may ask for
    explore_temperature: float = 0.7  # explorers sample at least this hot
    seed: int = 0                     # explorers' base seed when the request has none
    adaptive: bool = True             # start `initial` candidates, the rest only on disagreement
    initial: int = 0                  # 0: an absolute majority of N

    @classmethod
    def from_settings(cls, spec: ConclaveSettings) -> "ConclavePolicy":
        return cls(max_candidates=spec.max_candidates, explore_temperature=spec.explore_temperature,
                   seed=spec.seed, adaptive=spec.adaptive)


def candidate_requests(request: GenerationRequest, n: int, policy: ConclavePolicy) -> list[GenerationRequest]:
    """Candidate 0 samples as the request asks; candidate i with seed + i, hotter. Every one is
    `voted`: the engine's planner values their kept tokens knowing the vote may end the Conclave
    at any candidate's end, not at its slowest's."""
    request = dataclasses.replace(request, voted=n > 1)
    sampling = request.sampling
    base = sampling.seed if sampling.seed is not None else policy.seed
    temperature = max(sampling.temperature, policy.explore_temperature)
    out = [request]
    for i in range(1, n):
        explorer = dataclasses.replace(sampling, temperature=temperature, seed=(base + i) % SEED_SPACE)
        out.append(dataclasses.replace(request, sampling=explorer,
                                       request_id=f"{request.request_id}/{i}" if request.request_id else ""))
    return out


@dataclass(slots=True)
class Candidate:
    """One candidate's output as it streamed."""

    number: int
    handle: GenerationHandle
    pieces: list[Piece] = field(default_factory=list)
    finished: Finished | None = None

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)

    @property
    def completed(self) -> bool:
        return self.finished is not None and self.finished.reason in COMPLETED

    async def consume(self) -> "Candidate":
        async for event in self.handle:
            if isinstance(event, TextDelta):
                self.pieces.append(Piece(event.text, tuple(event.logprobs)))
            elif isinstance(event, Finished):
                self.finished = event
        return self


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decided Conclave: the winner and what it cost."""

    verdict: Verdict
    winner: Candidate
    candidates: int       # N asked for
    started: int          # candidates that ran (some perhaps stopped early)
    stopped_early: bool   # candidates were cancelled or never started because the vote was decided
    cancelled: int        # candidates stopped mid-generation
    at_once: bool = False  # every candidate started at the start (not adaptive, or the StartRecord's say)

    def summary(self) -> dict[str, object]:
        """The response's `reame` object."""
        return {"consensus": self.verdict.consensus, "candidates": self.candidates,
                "votes": dict(self.verdict.votes), "stopped_early": self.stopped_early,
                "decision": self.verdict.method, "started": self.started}


class ConclaveRun:
    """One Conclave: `start()` submits the first candidates (failing like any submit),
    `await decide()` returns the Outcome, `cancel()` stops everything (a client gone).
    `record`: the node's StartRecord, read for how an adaptive Conclave starts and told how it
    went (None: adaptive starting as configured, nothing learned)."""

    def __init__(self, submit: Submit, request: GenerationRequest, n: int, policy: ConclavePolicy,
                 record: StartRecord | None = None) -> None:
        self._submit = submit
        self.n = n
        self.policy = policy
        self._record = record if policy.adaptive else None
        self._at_once = self._record is not None and self._record.all_at_once(n)
        self._requests = candidate_requests(request, n, policy)
        self._candidates: list[Candidate] = []
        self._tasks: dict[int, asyncio.Task[Candidate]] = {}
        self._group: int | None = None
        self._done: asyncio.Queue[Candidate] = asyncio.Queue()
        grammar = request.sampling.grammar
        self._json_only = grammar is not None and grammar.kind == "json_schema"  # the vote counts parsed values only

    @property
    def first(self) -> int:
        """The candidates adaptive starting runs first."""
        return min(self.n, self.policy.initial or majority(self.n))

    @property
    def initial(self) -> int:
        """The candidates this Conclave starts with."""
        return self.n if not self.policy.adaptive or self._at_once else self.first

    def start(self) -> None:
        first = self.initial
        handles = self._submit(self._requests[:first], self.n - first, None)
        self._group = handles[0].group if handles else None
        self._watch(handles)

    def _watch(self, handles: Sequence[GenerationHandle]) -> None:
        for handle in handles:
            candidate = Candidate(len(self._candidates), handle)
            self._candidates.append(candidate)
            task = asyncio.ensure_future(candidate.consume())
            task.add_done_callback(self._finished(candidate))
            self._tasks[candidate.number] = task

    def _finished(self, candidate: Candidate) -> Callable[["asyncio.Task[Candidate]"], None]:
        return lambda _task: self._done.put_nowait(candidate)

    def _start_rest(self) -> None:
        rest = self._requests[len(self._candidates):]
        if not rest:
            return
        try:
            self._watch(self._submit(rest, 0, self._group))
        except (ServingError, EngineError) as exc:  # the vote goes on with the candidates it has
            log.warning("conclave: %d more candidates could not start: %s", len(rest), exc)
            self._requests = self._requests[:len(self._candidates)]

    async def decide(self) -> Outcome:
        texts: dict[int, str] = {}
        keys: dict[int, str | None] = {}
        verdict: Verdict | None = None
        finished: set[int] = set()
        while verdict is None:
            candidate = await self._done.get()
            finished.add(candidate.number)
            if candidate.completed:
                texts[candidate.number] = candidate.text
                keys[candidate.number] = answer_key(candidate.text, json_only=self._json_only)
            elif candidate.finished is not None:
                log.warning("conclave candidate %d ended with %s: %s", candidate.number, candidate.finished.reason,
                            candidate.finished.error)
            running = len(self._candidates) - len(finished)
            verdict = early(keys, self.n) or settled(keys, self._pending(finished))
            if verdict is not None:
                break
            counts = tally(keys)
            leading = max((len(members) for members in counts.values()), default=0)
            if len(self._candidates) < len(self._requests) and (running == 0 or leading + running < majority(self.n)):
                self._start_rest()
                running = len(self._candidates) - len(finished)
            if running == 0:
                if not texts:
                    ended = candidate.finished
                    if ended is not None and ended.retry_after_s > 0:
                        raise generation_failure(ended.reason, ended.error, ended.retry_after_s)
                    reason = ended.error if ended else None
                    raise GenerationFailed(f"Every Conclave candidate failed: {reason or 'no detail'}")
                verdict = decide(texts, self.n, json_only=self._json_only)
        cancelled = await self._stop_running()
        verdict = self._count_late(verdict, keys, finished)
        stopped = cancelled > 0 or len(self._candidates) < len(self._requests)
        if self._record is not None:
            self._record.record(self.n, needed=not first_sufficed(verdict, keys, self.n, self.first), first=self.first)
        return Outcome(verdict, self._candidates[verdict.winner], self.n, len(self._candidates), stopped, cancelled,
                       self.initial == self.n)

    def _count_late(self, verdict: Verdict, keys: dict[int, str | None], finished: set[int]) -> Verdict:
        """The verdict with the votes of candidates that ended on their own after it was taken
        (in the same engine step as the deciding one, or before their cancel was applied): a
        candidate that finished its answer always shows in `votes`. The winner stands: a
        majority or a settled plurality is one no pending answer could change. Read from the
        candidates themselves (a task that has returned has its end), not from the queue their
        done callbacks fill, which may not have run yet."""
        late = [c for c in self._candidates
                if c.number not in finished and self._tasks[c.number].done() and c.completed]
        if not late:
            return verdict
        for candidate in late:
            keys[candidate.number] = answer_key(candidate.text, json_only=self._json_only)
        counts = tally(keys)
        consensus = next((len(members) for members in counts.values() if verdict.winner in members),
                         verdict.consensus)
        return dataclasses.replace(verdict, consensus=consensus, votes=votes_of(counts))

    def _pending(self, finished: set[int]) -> list[int]:
        """The candidates that may still vote: running, or not started yet."""
        return [number for number in range(len(self._requests)) if number not in finished]

    async def _stop_running(self) -> int:
        """Cancels the candidates still running and waits for their ends; returns how many the
        cancel stopped (one that finished its answer before the engine applied it is not counted)."""
        running = [c for c in self._candidates if not self._tasks[c.number].done()]
        for candidate in running:
            candidate.handle.cancel()
        if running:
            await asyncio.wait([self._tasks[c.number] for c in running], timeout=CANCEL_WAIT_S)
        return sum(1 for c in running if not c.completed)

    def cancel(self) -> None:
        for candidate in self._candidates:
            candidate.handle.cancel()

    @property
    def candidates(self) -> list[Candidate]:
        return list(self._candidates)
