"""The answer to one plan: L1 lookups, engine submits, events in order, cancel on leaving.

`service.answer(plan)` (node/serving/service.py) is an async context manager over the node's
`Jobs` (node/serving/jobs.py), never the service: entering it
looks every keyed job up in L1, submits the misses to the engine and waits until each
holds a slot (so overload, too-long prompts and a wait for room past the queue's bound
fail before any byte is sent); iterating `answer.events()` yields
`ChoiceText` and `ChoiceDone` in generation order, hits replayed exactly as they once
streamed (a Conclave's or best_of's job through node/serving/conclave/events.py); leaving it
cancels whatever is still generating, which is how a client that goes
away stops its generation within one engine step. While a live (interactive) answer is open,
batch lines wait for their turn before their work on the event loop (node/serving/live_first.py). A completed generation goes to
`jobs.finish()` (counted, served in the ledger, remembered in L1 and L4) and, for a session
turn, extends the session.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Sequence

from node.engine.types import COMPLETED, INTERACTIVE, Finished, GenerationHandle, TextDelta
from node.serving.conclave.events import best_of_events, conclave_events
from node.serving.conclave.runner import ConclaveRun
from node.serving.errors import Overloaded, generation_failure
from node.serving.jobs import Jobs
from node.serving.l1 import Piece, StoredAnswer, StoredChoice
from node.serving.plan import ChoiceDone, ChoiceEvent, ChoiceText, Job, Plan


class Answer:
    """The events of one plan; see the module docstring for its lifecycle."""

    cache: str  # "hit" | "miss" | "bypass" (nothing keyed: the archive was not asked)

    def __init__(self, jobs: Jobs, plan: Plan) -> None:
        self.jobs = jobs
        self.plan = plan
        self.cache = "bypass"
        self.started = time.perf_counter()
        self._stored: list[StoredAnswer | None] = []
        self._handles: list[Sequence[GenerationHandle]] = []
        self._runs: dict[int, ConclaveRun] = {}  # job number -> its Conclave
        self._generated: tuple[int, ...] | None = None  # choice 0's token ids (None: replayed from L1)

    async def __aenter__(self) -> "Answer":
        jobs = self.plan.jobs
        self.jobs.ledger.enter()
        if self.live:
            self.jobs.live_first.enter()
        try:
            self._stored = list(await asyncio.gather(*(self.jobs.lookup(job) for job in jobs)))
            keyed = [job.key is not None for job in jobs]
            if any(keyed):
                self.cache = "hit" if all(s is not None for s in self._stored) else "miss"
            misses = [job for job, stored in zip(jobs, self._stored) if stored is None]
            await asyncio.gather(*(self.jobs.prepare(job, self.plan.options.output) for job in misses[:1]))
            await asyncio.gather(*(self.jobs.prefetch(job.prompt_tokens, job.request.cache_scope) for job in misses))
            for number, (job, stored) in enumerate(zip(jobs, self._stored)):
                if stored is not None:
                    self._handles.append([])
                elif job.conclave > 1:
                    self._runs[number] = self.jobs.start_conclave(job)
                    self._handles.append([])
                elif job.best_of > job.n:
                    self._handles.append(self.jobs.submit_best_of(job))
                else:
                    self._handles.append(self.jobs.submit(job))
            await self._started()
        except BaseException:
            self._cancel()
            self._leave()
            raise
        return self

    @property
    def live(self) -> bool:
        """A live request's answer (batch lines wait for live ones, node/serving/live_first.py)."""
        return any(job.request.priority == INTERACTIVE for job in self.plan.jobs)

    def _leave(self) -> None:
        self.jobs.ledger.leave()
        if self.live:
            self.jobs.live_first.leave()

    @property
    def generated(self) -> tuple[int, ...] | None:
        """Choice 0's generated token ids once it finished (None: replayed from L1, or not done)."""
        return self._generated

    async def _started(self) -> None:
        """Wait until each submitted job's first generation holds a slot (so a request the engine
        gives up on, no room having come free within the queue's wait bound, is a 503 before
        any byte of the answer is sent)."""
        firsts = [handles[0] for handles in self._handles if handles]
        firsts += [run.candidates[0].handle for run in self._runs.values() if run.candidates]
        waits = [started() for started in (getattr(handle, "started", None) for handle in firsts) if started]
        for retry_after_s in await asyncio.gather(*waits):
            if retry_after_s > 0:
                raise Overloaded("No slot or KV room came free within this node's queue wait bound "
                                 "([server] max_queue_wait_s); retry later", retry_after_s=retry_after_s)

    async def __aexit__(self, *exc_info: object) -> None:
        self._cancel()
        self._leave()

    def _cancel(self) -> None:
        for run in self._runs.values():
            run.cancel()
        for handles in self._handles:
            for handle in handles:
                handle.cancel()

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        sources: list[AsyncIterator[ChoiceEvent]] = []
        for number, (job, stored, handles) in enumerate(zip(self.plan.jobs, self._stored, self._handles)):
            for choice in range(job.n):
                if job.echo_text:
                    sources.append(_single(ChoiceText(job.first_choice + choice, job.echo_text)))
            if stored is not None:
                sources.append(self._replay(job, stored))
            elif number in self._runs:
                sources.append(conclave_events(self.jobs, job, self._runs[number]))
            elif job.best_of > job.n:
                sources.append(best_of_events(self.jobs, job, handles, job.request.logprobs is not None))
            else:
                sources.append(self._generate(job, handles))
        first = True
        answer: list[str] = []
        finish_reason = None
        async for event in _merge(sources):
            if first and isinstance(event, ChoiceText):
                first = False
                self.jobs.metrics.ttft.labels(self.cache).observe(time.perf_counter() - self.started)
            if isinstance(event, ChoiceText) and event.index == 0:
                answer.append(event.text)
            elif isinstance(event, ChoiceDone) and event.index == 0:
                finish_reason = event.finish_reason
            yield event
        self.jobs.metrics.prompt_tokens.inc(self.plan.prompt_tokens)
        turn = self.plan.turn
        if turn is not None and finish_reason in COMPLETED and self.jobs.turns is not None:
            await self.jobs.turns.complete(turn, "".join(answer), self._generated)

    async def _replay(self, job: Job, stored: StoredAnswer) -> AsyncIterator[ChoiceEvent]:
        for offset, choice in enumerate(stored.choices):
            index = job.first_choice + offset
            for piece in choice.pieces:
                yield ChoiceText(index, piece.text, piece.logprobs)
            yield ChoiceDone(index, choice.finish_reason, choice.completion_tokens,
                             stored.consensus if offset == 0 else None,
                             len(job.prompt_tokens) if offset == 0 else 0,  # an L1 answer computes no prompt
                             choice.stop_sequence)
        self.jobs.replayed(job, stored)

    async def _generate(self, job: Job, handles: Sequence[GenerationHandle]) -> AsyncIterator[ChoiceEvent]:
        pieces: list[list[Piece]] = [[] for _ in handles]
        finished: list[Finished | None] = [None] * len(handles)

        async def one(offset: int, handle: GenerationHandle) -> AsyncIterator[ChoiceEvent]:
            index = job.first_choice + offset
            async for event in handle:
                if isinstance(event, TextDelta):
                    pieces[offset].append(Piece(event.text, tuple(event.logprobs)))
                    yield ChoiceText(index, event.text, tuple(event.logprobs))
                elif isinstance(event, Finished):
                    finished[offset] = event
                    if event.reason not in COMPLETED:
                        raise generation_failure(event.reason, event.error, event.retry_after_s)
                    if index == 0:
                        self._generated = event.generated
                    yield ChoiceDone(index, event.reason, event.completion_tokens, cached_tokens=event.cached_tokens,
                                     stop_sequence=event.stop_sequence)

        async for event in _merge([one(offset, handle) for offset, handle in enumerate(handles)]):
            yield event
        done = [event for event in finished if event is not None]
        if len(done) == len(handles):
            self.jobs.finish(
                job,
                [StoredChoice(tuple(p), f.reason, f.completion_tokens, f.stop_sequence) for p, f in zip(pieces, done)],
                [tuple(f.generated) for f in done], computed=sum(f.completion_tokens for f in done),
            )


async def _single(event: ChoiceEvent) -> AsyncIterator[ChoiceEvent]:
    yield event


class _End:
    """Marks the end of one source in the merged queue."""


_END = _End()


async def _merge(sources: list[AsyncIterator[ChoiceEvent]]) -> AsyncIterator[ChoiceEvent]:
    """Events of several sources in arrival order; the first failure ends them all."""
    if len(sources) == 1:
        async for event in sources[0]:
            yield event
        return
    queue: asyncio.Queue[ChoiceEvent | Exception | _End] = asyncio.Queue()

    async def pump(source: AsyncIterator[ChoiceEvent]) -> None:
        try:
            async for event in source:
                queue.put_nowait(event)
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if isinstance(item, _End):
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
