"""Request orchestration: archive lookup -> engine -> archive fill and observe.

A validated request becomes a `Plan`: one `Job` per prompt, each already rendered through
the chat template, tokenized, and (when deterministic) keyed for L1. `service.answer(plan)`
is an async context manager: entering it looks every keyed job up in L1 and submits the
misses to the engine (so overload and too-long prompts fail before any byte is sent);
iterating `answer.events()` yields `ChoiceText` and `ChoiceDone` in generation order, hits
replayed exactly as they once streamed; leaving it cancels whatever is still generating,
which is how a client that goes away stops its generation within one engine step.

Deterministic means greedy (temperature 0). Sampled requests, seeded or not, always run
the model: a seeded sample is only as reproducible as the sampler implementation, and
clients setting a seed usually vary it on purpose.

After a job completes (every choice finished with `stop` or `length`, never cancelled or
failed), two writes happen off the request's critical path, as background tasks bounded
by `ServiceOptions.max_pending_writes`: the answer goes to L1 (when keyed and non-empty),
and each choice's token stream is OBSERVEd into the L4 corpus under the model's
fingerprint: the last `observe_prompt_tokens` prompt tokens followed by every generated
token, so later drafts can continue from prompt context into the answer. `[arca] observe
= false` turns observing off.

The prefix KV cache: before a job reaches the engine, the fleet tier brings the prompt's
longest stored prefix into RAM (from the local disk, and from ARCA's L3 when the node has a
remote ARCA), bounded by `prefetch_timeout_s` so a slow archive costs only the speed-up.
Chat requests inside a session (node/session_turns.py) continue the session's tokens; their
engine request asks for the final state (prompt + answer) to be stored in the cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

from node.api.errors import ContextLengthExceeded, InternalError, InvalidRequest, Overloaded
from node.api.metrics import Metrics
from node.api.schemas import ChatRequest, CompletionRequest, GenerationOptions
from node.archive_client import ArchiveClient
from node.engine import errors as engine_errors
from node.engine.types import Finished, GenerationRequest, TextDelta, TokenLogprob
from node.l1 import Piece, StoredAnswer, StoredChoice, decode_answer, encode_answer, l1_key
from node.served_model import ServedModel
from node.sessions import Session, SessionStore
from node.session_turns import SessionTurn, SessionTurns
from node.template_cuts import CutError, rendered_tokens
from node.warm import WarmResult, warm

log = logging.getLogger(__name__)
COMPLETED = ("stop", "length")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    l1_enabled: bool = True
    l1_ttl_s: int | None = None
    observe: bool = True
    observe_prompt_tokens: int = 64
    max_pending_writes: int = 256
    prefetch_timeout_s: float = 2.0  # a fleet prefetch longer than this is given up


@dataclass(frozen=True, slots=True)
class Job:
    first_choice: int
    prompt_tokens: tuple[int, ...]
    echo_text: str
    request: GenerationRequest
    n: int
    key: bytes | None


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str  # "chat" | "text"
    jobs: tuple[Job, ...]
    options: GenerationOptions
    turn: SessionTurn | None = None  # a chat turn inside a session

    @property
    def prompt_tokens(self) -> int:
        return sum(len(job.prompt_tokens) for job in self.jobs)


@dataclass(frozen=True, slots=True)
class ChoiceText:
    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceDone:
    index: int
    finish_reason: str
    completion_tokens: int


ChoiceEvent = ChoiceText | ChoiceDone


class CompletionService:
    def __init__(self, engine, archive: ArchiveClient, model: ServedModel, metrics: Metrics,
                 options: ServiceOptions = ServiceOptions(), *, cache=None, fleet=None,
                 sessions: SessionStore | None = None) -> None:
        self.engine = engine
        self.archive = archive
        self.model = model
        self.metrics = metrics
        self.options = options
        self.cache = cache  # node.cache.PrefixCache, or None when the prefix cache is off
        self.fleet = fleet  # node.cache.FleetTier, or None
        self.turns = SessionTurns(self, sessions) if sessions is not None else None
        self._writes: set[asyncio.Task] = set()

    # ---- planning -------------------------------------------------------------------

    def plan_completion(self, req: CompletionRequest) -> Plan:
        jobs = []
        for number, prompt in enumerate(req.prompts):
            if isinstance(prompt, str):
                tokens = tuple(self.engine.tokenize(prompt, add_bos=True, special=True))
                text = prompt
            else:
                bad = [token for token in prompt if token >= self.model.n_vocab]
                if bad:
                    raise InvalidRequest(f"'prompt' holds token ids outside the vocabulary of "
                                         f"{self.model.n_vocab}: {bad[:5]}", param="prompt", code="invalid_value")
                tokens = prompt
                text = self.engine.detokenize(prompt).decode("utf-8", "replace") if req.echo else ""
            jobs.append(self._job(number, "text", "none", tokens, text if req.echo else "", req.options, ()))
        return Plan("text", tuple(jobs), req.options)

    def plan_chat(self, req: ChatRequest, session: Session | None = None) -> Plan:
        template = self.model.template
        messages = [message.as_dict() for message in req.messages]
        turn = None
        try:
            if session is None:
                tokens = self.chat_tokens(messages)
            else:
                if self.turns is None:
                    raise InvalidRequest("Sessions are not enabled on this node", param="session")
                if req.options.n != 1:
                    raise InvalidRequest("A session turn has one answer: 'n' must be 1", param="n")
                turn = self.turns.begin(session, messages)
                tokens = turn.prompt_tokens
        except (ValueError, CutError) as exc:  # TemplateError: roles the template cannot express, ...
            raise InvalidRequest(str(exc), param="messages", code="invalid_value") from None
        job = self._job(0, "chat", template.name, tuple(tokens), "", req.options, tuple(template.stop_strings),
                        store_final_state=turn is not None and self.cache is not None)
        return Plan("chat", (job,), req.options, turn)

    def chat_tokens(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> tuple[int, ...]:
        """Messages rendered through the chat template and tokenized (template errors raise)."""
        return self.text_tokens(self.model.template.render(messages, add_generation_prompt=add_generation_prompt))

    def text_tokens(self, rendered: str) -> tuple[int, ...]:
        return rendered_tokens(self.engine, rendered)

    def _job(self, number: int, kind: str, template: str, tokens: tuple[int, ...], echo: str,
             options: GenerationOptions, extra_stop: Sequence[str], *, store_final_state: bool = False) -> Job:
        outside = [token for token in options.sampling.logit_bias if token >= self.model.n_vocab]
        if outside:
            raise InvalidRequest(f"'logit_bias' holds token ids outside the vocabulary of "
                                 f"{self.model.n_vocab}: {outside[:5]}", param="logit_bias", code="invalid_value")
        key = None
        if self.options.l1_enabled and options.deterministic:
            key = l1_key(fingerprint=self.model.fingerprint, kv_type=self.model.kv_type, kind=kind,
                         template=template, prompt_tokens=tokens, options=options)
        request = GenerationRequest(
            prompt_tokens=tokens, max_tokens=options.max_tokens, sampling=options.sampling,
            stop=tuple(dict.fromkeys((*options.stop, *extra_stop))), logprobs=options.logprobs,
            store_final_state=store_final_state,
        )
        return Job(number * options.n, tokens, echo, request, options.n, key)

    # ---- answering ------------------------------------------------------------------

    def answer(self, plan: Plan) -> "Answer":
        return Answer(self, plan)

    async def lookup(self, job: Job) -> StoredAnswer | None:
        if job.key is None:
            return None
        started = time.perf_counter()
        value = await self.archive.get(job.key)
        self.metrics.archive_latency.labels("get").observe(time.perf_counter() - started)
        stored = decode_answer(value) if value is not None else None
        if stored is not None and len(stored.choices) != job.n:
            stored = None
        (self.metrics.archive_hits if stored is not None else self.metrics.archive_misses).inc()
        return stored

    async def prefetch(self, tokens: Sequence[int]) -> None:
        """Bring the prompt's longest stored prefix into RAM before the engine looks it up."""
        if self.fleet is not None:
            await self.fleet.prefetch_within(tokens, self.options.prefetch_timeout_s)

    async def warm(self, tokens: Sequence[int]) -> WarmResult:
        """Prefill `tokens` into the prefix cache (node/warm.py); engine errors as API errors."""
        if self.cache is None:
            raise InvalidRequest("The prefix cache is off on this node ([cache] enabled = false)",
                                 code="cache_disabled")
        return await warm(self.engine, self.cache, tokens, fleet=self.fleet,
                          prefetch_timeout_s=self.options.prefetch_timeout_s,
                          submit=lambda request: self.submit_request(request, 1)[0])

    def submit(self, job: Job) -> list:
        return self.submit_request(job.request, job.n)

    def submit_request(self, request: GenerationRequest, n: int) -> list:
        loop = asyncio.get_running_loop()
        try:
            if n == 1:
                return [self.engine.submit(request, loop)]
            return list(self.engine.submit_n(request, n, loop))
        except engine_errors.EngineOverloaded:
            raise Overloaded("Every slot and queue place is taken; retry shortly", retry_after_s=1) from None
        except engine_errors.EngineClosed:
            raise Overloaded("The node is shutting down", retry_after_s=5) from None
        except engine_errors.PromptTooLong as exc:
            fits = exc.prompt_tokens < exc.n_ctx  # then a smaller max_tokens would do
            raise ContextLengthExceeded(str(exc), param="max_tokens" if fits else None) from None
        except engine_errors.InvalidRequest as exc:
            raise InvalidRequest(str(exc)) from None

    # ---- after a completed job --------------------------------------------------------

    def remember(self, job: Job, choices: list[StoredChoice], generated: list[tuple[int, ...]]) -> None:
        if any(choice.finish_reason not in COMPLETED for choice in choices):
            return
        if job.key is not None and sum(choice.completion_tokens for choice in choices) > 0:
            record = encode_answer(StoredAnswer(len(job.prompt_tokens), tuple(choices)))
            self._background("set", self.archive.set(job.key, record, self.options.l1_ttl_s))
        if self.options.observe:
            context = job.prompt_tokens[-self.options.observe_prompt_tokens:] if self.options.observe_prompt_tokens else ()
            namespace = self.model.fingerprint.encode()
            for tokens in generated:
                if tokens:
                    self._background("observe", self.archive.observe(namespace, (*context, *tokens)))

    def _background(self, operation: str, write) -> None:
        if len(self._writes) >= self.options.max_pending_writes:
            write.close()
            self.metrics.background_dropped.inc()
            return
        task = asyncio.create_task(self._timed(operation, write))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _timed(self, operation: str, write) -> None:
        started = time.perf_counter()
        await write
        self.metrics.archive_latency.labels(operation).observe(time.perf_counter() - started)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for pending archive writes; used at shutdown and by tests."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)


class Answer:
    """The events of one plan; see the module docstring for its lifecycle."""

    def __init__(self, service: CompletionService, plan: Plan) -> None:
        self.service = service
        self.plan = plan
        self.cache = "bypass"
        self.started = time.perf_counter()
        self._stored: list[StoredAnswer | None] = []
        self._handles: list[list] = []
        self._generated: tuple[int, ...] | None = None  # choice 0's token ids (None: replayed from L1)

    async def __aenter__(self) -> "Answer":
        jobs = self.plan.jobs
        self._stored = list(await asyncio.gather(*(self.service.lookup(job) for job in jobs)))
        keyed = [job.key is not None for job in jobs]
        if any(keyed):
            self.cache = "hit" if all(s is not None for s in self._stored) else "miss"
        misses = [job.prompt_tokens for job, stored in zip(jobs, self._stored) if stored is None]
        await asyncio.gather(*(self.service.prefetch(tokens) for tokens in misses))
        try:
            for job, stored in zip(jobs, self._stored):
                self._handles.append([] if stored is not None else self.service.submit(job))
        except BaseException:
            self._cancel()
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        self._cancel()

    def _cancel(self) -> None:
        for handles in self._handles:
            for handle in handles:
                handle.cancel()

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        sources = []
        for job, stored, handles in zip(self.plan.jobs, self._stored, self._handles):
            for choice in range(job.n):
                if job.echo_text:
                    sources.append(_single(ChoiceText(job.first_choice + choice, job.echo_text)))
            sources.append(self._replay(job, stored) if stored is not None else self._generate(job, handles))
        first = True
        answer: list[str] = []
        finish_reason = None
        async for event in _merge(sources):
            if first and isinstance(event, ChoiceText):
                first = False
                self.service.metrics.ttft.labels(self.cache).observe(time.perf_counter() - self.started)
            if isinstance(event, ChoiceText) and event.index == 0:
                answer.append(event.text)
            elif isinstance(event, ChoiceDone) and event.index == 0:
                finish_reason = event.finish_reason
            yield event
        self.service.metrics.prompt_tokens.inc(self.plan.prompt_tokens)
        turn = self.plan.turn
        if turn is not None and finish_reason in COMPLETED and self.service.turns is not None:
            await self.service.turns.complete(turn, "".join(answer), self._generated)

    async def _replay(self, job: Job, stored: StoredAnswer) -> AsyncIterator[ChoiceEvent]:
        for offset, choice in enumerate(stored.choices):
            index = job.first_choice + offset
            for piece in choice.pieces:
                yield ChoiceText(index, piece.text, piece.logprobs)
            yield ChoiceDone(index, choice.finish_reason, choice.completion_tokens)

    async def _generate(self, job: Job, handles: list) -> AsyncIterator[ChoiceEvent]:
        pieces: list[list[Piece]] = [[] for _ in handles]
        finished: list[Finished | None] = [None] * len(handles)

        async def one(offset: int, handle) -> AsyncIterator[ChoiceEvent]:
            index = job.first_choice + offset
            async for event in handle:
                if isinstance(event, TextDelta):
                    pieces[offset].append(Piece(event.text, tuple(event.logprobs)))
                    yield ChoiceText(index, event.text, tuple(event.logprobs))
                elif isinstance(event, Finished):
                    finished[offset] = event
                    if event.reason not in COMPLETED:
                        raise InternalError(f"Generation {event.reason}: {event.error or 'no detail'}")
                    self.service.metrics.generated_tokens.inc(event.completion_tokens)
                    if index == 0:
                        self._generated = event.generated
                    yield ChoiceDone(index, event.reason, event.completion_tokens)

        async for event in _merge([one(offset, handle) for offset, handle in enumerate(handles)]):
            yield event
        done = [event for event in finished if event is not None]
        if len(done) == len(handles):
            self.service.remember(
                job,
                [StoredChoice(tuple(p), f.reason, f.completion_tokens) for p, f in zip(pieces, done)],
                [tuple(f.generated) for f in done],
            )


async def _single(event: ChoiceEvent) -> AsyncIterator[ChoiceEvent]:
    yield event


_END = object()


async def _merge(sources: list[AsyncIterator[ChoiceEvent]]) -> AsyncIterator[ChoiceEvent]:
    """Events of several sources in arrival order; the first failure ends them all."""
    if len(sources) == 1:
        async for event in sources[0]:
            yield event
        return
    queue: asyncio.Queue = asyncio.Queue()

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
            if item is _END:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
