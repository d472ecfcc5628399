"""Request orchestration: archive lookup -> engine -> archive fill and observe.

A validated request (node/serving/requests.py) becomes a `Plan` (node/serving/plan.py):
one `Job` per prompt, each already rendered through the chat template, tokenized
(node/serving/prompts.py), and (when deterministic) keyed for L1 (node/serving/l1.py). A plan
is made for one tenant (node/serving/tenants.py, the API key the request came with): its L1
keys and its prefix states are that tenant's alone.
`service.answer(plan)` returns the `Answer` (node/serving/answer.py) that looks jobs up,
submits the misses and yields the choices' events.

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
Chat requests inside a session (node/sessions/turns.py) continue the session's tokens; their
engine request asks for the final state (prompt + answer) to be stored in the cache.

A job with `conclave` > 1 runs as a Conclave (node/serving/conclave/): candidates forked from
one prefill, one answer by vote, its verdict in the answer (and in L1 with it, the node's
explorer and adaptive-start settings in the key); a job with `best_of` > n runs best_of candidates on the same
forks and answers the n with the highest mean token log-probability.

`embed(inputs, dimensions=None)` answers embeddings for every API that has them
(node/serving/embeddings.py: L1 per input, the misses batched in the engine).

The engine's typed errors become the serving layer's here, at submit, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Coroutine, Iterator, Mapping, Sequence

import numpy as np

from node.archive.client import ArchiveClient
from node.cache.fleet import FleetTier
from node.cache.prefix_cache import PrefixCache
from node.engine import errors as engine_errors
from node.engine.types import INTERACTIVE, GenerationHandle, GenerationRequest, GrammarSpec
from node.engine.grammar_limits import short_error
from node.serving import structure
from node.serving.answer import Answer
from node.serving.conclave.runner import SEED_SPACE, ConclavePolicy, ConclaveRun
from node.serving.embeddings import EmbeddingInput, EmbeddingLimits, Embeddings, EmbeddingUsage
from node.serving.engine_client import EngineClient
from node.serving.grammar_workers import GrammarWorkers
from node.serving.errors import ContextLengthExceeded, InvalidRequest, Overloaded, UnsupportedFeature
from node.serving.l1 import StoredAnswer, StoredChoice, decode_answer, encode_answer, l1_key
from node.serving.ledger import Ledger
from node.serving.live_first import BATCH_INTERVAL_S, LiveFirst
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.plan import COMPLETED, Job, Plan
from node.serving.prompts import Prompts
from node.serving.requests import ChatRequest, CompletionRequest, GenerationOptions, Output
from node.serving.structure import ToolMarkers, new_call_id, tool_prompt
from node.serving.tenants import OPEN
from node.sessions.cuts import CutError
from node.sessions.store import Session, Sessions
from node.sessions.turns import SessionTurns
from node.sessions.warm import WarmResult, warm

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    l1_enabled: bool = True
    l1_ttl_s: int | None = None
    observe: bool = True
    observe_prompt_tokens: int = 64
    max_pending_writes: int = 256
    prefetch_timeout_s: float = 2.0  # a fleet prefetch longer than this is given up
    max_queue_wait_s: float = 0.0  # a live request waiting longer for a slot is a 503 (0: no bound)
    batch_interval_s: float = BATCH_INTERVAL_S  # while live requests are answered, one batch line per this
    conclave: ConclavePolicy = field(default_factory=ConclavePolicy)
    embeddings: EmbeddingLimits = field(default_factory=EmbeddingLimits)


class CompletionService:
    def __init__(self, engine: EngineClient, archive: ArchiveClient, model: ServedModel, metrics: Metrics,
                 options: ServiceOptions = ServiceOptions(), *, cache: PrefixCache | None = None,
                 fleet: FleetTier | None = None, sessions: Sessions | None = None) -> None:
        self.engine = engine
        self.archive = archive
        self.model = model
        self.metrics = metrics
        self.options = options
        self.cache = cache  # None when the prefix cache is off
        self.fleet = fleet
        self.prompts = Prompts(model.template, engine)
        self.turns = (SessionTurns(sessions, model.template, self.prompts, cache, self.warm)
                      if sessions is not None else None)
        self._writes: set[asyncio.Task[None]] = set()
        self.ledger = Ledger()  # what was served (node/serving/ledger.py)
        self.embeddings = Embeddings(self, options.embeddings)
        self.grammar_workers = GrammarWorkers()  # schema checks and grammar compiles, off the loop
        self.verified = structure.Verified()
        self.live_first = LiveFirst(options.batch_interval_s)  # batch lines' loop work waits for live requests

    # ---- structure --------------------------------------------------------------------

    async def verify(self, options: GenerationOptions) -> None:
        """The request's schemas and grammar pass the checks that cost time (node/serving/
        structure.py), on a grammar thread within its budget; raises a 400 naming the field."""
        pairs = self.verified.pending(structure.checks(options))
        if pairs:
            await self.grammar_workers.run(pairs[0][0], self._verify, pairs)

    def verify_blocking(self, options: GenerationOptions) -> None:
        """`verify` for a thread that may block (batch validation)."""
        pairs = self.verified.pending(structure.checks(options))
        if pairs:
            self.grammar_workers.call(pairs[0][0], self._verify, pairs)

    def _verify(self, pairs: list[tuple[str, GrammarSpec]]) -> None:
        """On a grammar thread: what passes is remembered even when its waiter gave up (over
        budget), so the same request sent again passes at once."""
        structure.verify_all(pairs)
        self.verified.add(pairs)

    # ---- planning -------------------------------------------------------------------

    def plan_completion(self, req: CompletionRequest, *, priority: int = INTERACTIVE, tenant: str = OPEN) -> Plan:
        jobs = []
        for number, prompt in enumerate(req.prompts):
            if isinstance(prompt, str):
                tokens = self.prompts.completion(prompt)
                text = prompt
            else:
                bad = [token for token in prompt if token >= self.model.n_vocab]
                if bad:
                    raise InvalidRequest(f"'prompt' holds token ids outside the vocabulary of "
                                         f"{self.model.n_vocab}: {bad[:5]}", param="prompt", code="invalid_value")
                tokens = prompt
                text = self.engine.detokenize(prompt).decode("utf-8", "replace") if req.echo else ""
            jobs.append(self._job(number, "text", "none", tokens, text if req.echo else "", req.options, (),
                                  priority=priority, tenant=tenant))
        if req.options.conclave > 1 and len(jobs) > 1:
            raise InvalidRequest("A Conclave answers one prompt: send 'prompt' as one string or token array",
                                 param="prompt", code="invalid_value")
        return Plan("text", tuple(jobs), req.options)

    def plan_chat(self, req: ChatRequest, session: Session | None = None, *, priority: int = INTERACTIVE,
                  tenant: str = OPEN) -> Plan:
        template = self.model.template
        messages = [message.as_dict() for message in req.messages]
        output = req.options.output
        tools = None
        markers = None
        if output is not None and output.choice is not None:
            markers = ToolMarkers.of_template(template.source)
            if markers is not None:
                tools = [tool.as_dict() for tool in output.tools]
            elif output.choice == "auto":
                raise UnsupportedFeature(
                    f"Tool calls chosen by the model (tool_choice 'auto') are not supported by this model: its chat "
                    f"template ({template.name}) does not render tools or mark calls; use tool_choice 'required' "
                    f"or name a function", param=output.param)
            else:  # a forced call: tell the model what it is calling
                messages = with_system(messages, tool_prompt(output.tools, output.function))
        turn = None
        try:
            if session is None:
                tokens = self.prompts.chat(messages, tools=tools)
            else:
                if self.turns is None:
                    raise InvalidRequest("Sessions are not enabled on this node", param="session")
                if req.options.n != 1:
                    raise InvalidRequest("A session turn has one answer: 'n' must be 1", param="n")
                if req.options.conclave > 1 or req.options.best_of > 1:
                    field_name = "conclave" if req.options.conclave > 1 else "best_of"
                    raise InvalidRequest(f"A session turn has one plain answer: '{field_name}' is not "
                                         "available inside a session", param=field_name, code="invalid_value")
                turn = self.turns.begin(session, messages,
                                        new_call_id() if output is not None and output.forced_call else None)
                tokens = turn.prompt_tokens
        except (ValueError, CutError) as exc:  # TemplateError: roles the template cannot express, ...
            raise InvalidRequest(str(exc), param="messages", code="invalid_value") from None
        job = self._job(0, "chat", template.name, tuple(tokens), "", req.options, tuple(template.stop_strings),
                        store_final_state=turn is not None and self.cache is not None, priority=priority,
                        tenant=tenant)
        return Plan("chat", (job,), req.options, turn, markers)

    def _job(self, number: int, kind: str, template: str, tokens: tuple[int, ...], echo: str,
             options: GenerationOptions, extra_stop: Sequence[str], *, store_final_state: bool = False,
             priority: int = INTERACTIVE, tenant: str = OPEN) -> Job:
        outside = [token for token in options.sampling.logit_bias if token >= self.model.n_vocab]
        if outside:
            raise InvalidRequest(f"'logit_bias' holds token ids outside the vocabulary of "
                                 f"{self.model.n_vocab}: {outside[:5]}", param="logit_bias", code="invalid_value")
        policy = self.options.conclave
        if options.conclave > policy.max_candidates:
            raise InvalidRequest(f"'conclave' must be between 1 and {policy.max_candidates} on this node "
                                 f"([conclave] max_candidates), got {options.conclave}",
                                 param="conclave", code="invalid_value")
        key = None
        if self.options.l1_enabled and options.deterministic:
            extra: Mapping[str, Any] | None = None
            if options.conclave > 1:  # the explorers' sampling and which candidates run are the node's settings
                extra = {"conclave.explore_temperature": policy.explore_temperature,
                         "conclave.seed": policy.seed, "conclave.adaptive": policy.adaptive,
                         "conclave.initial": policy.initial}
            key = l1_key(fingerprint=self.model.fingerprint, kv_type=self.model.kv_type, kind=kind,
                         template=template, prompt_tokens=tokens, options=options, extra=extra, tenant=tenant)
        request = GenerationRequest(
            prompt_tokens=tokens, max_tokens=options.max_tokens, sampling=options.sampling,
            stop=tuple(dict.fromkeys((*options.stop, *extra_stop))), logprobs=options.logprobs,
            store_final_state=store_final_state, speculation=options.speculation, priority=priority,
            max_wait_s=self.options.max_queue_wait_s if priority == INTERACTIVE else 0.0,  # batch lines wait
            cache_scope=tenant,
        )
        return Job(number * options.n, tokens, echo, request, options.n, key, options.conclave,
                   max(options.best_of, options.n))

    # ---- embeddings -----------------------------------------------------------------

    async def embed(self, inputs: Sequence[EmbeddingInput], dimensions: int | None = None,
                    tenant: str = OPEN) -> tuple[np.ndarray, EmbeddingUsage]:
        """One L2-normalised float32 row per input (strings or token-id sequences), in order, cut
        to `dimensions` and normalised again when given (L1 within the tenant's scope); raises
        InvalidRequest (400) for inputs or dimensions out of bounds, Overloaded (503)."""
        return await self.embeddings.embed(inputs, dimensions, tenant)

    # ---- answering ------------------------------------------------------------------

    def answer(self, plan: Plan) -> Answer:
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

    async def prefetch(self, tokens: Sequence[int], scope: str = OPEN) -> None:
        """Bring the prompt's longest stored prefix (the tenant's) into RAM before the engine looks it up."""
        if self.fleet is not None:
            await self.fleet.prefetch_within(tokens, self.options.prefetch_timeout_s, scope)

    async def warm(self, tokens: Sequence[int], tenant: str = OPEN) -> WarmResult:
        """Prefill `tokens` into the tenant's prefix cache (node/sessions/warm.py)."""
        if self.cache is None:
            raise InvalidRequest("The prefix cache is off on this node ([cache] enabled = false)",
                                 code="cache_disabled")
        return await warm(lambda request: self.submit_request(request, 1)[0], self.cache, tokens,
                          fleet=self.fleet, prefetch_timeout_s=self.options.prefetch_timeout_s,
                          max_wait_s=self.options.max_queue_wait_s, scope=tenant)

    def submit(self, job: Job) -> Sequence[GenerationHandle]:
        return self.submit_request(job.request, job.n)

    def submit_request(self, request: GenerationRequest, n: int) -> Sequence[GenerationHandle]:
        loop = asyncio.get_running_loop()
        with self._engine_errors():
            if n == 1:
                return [self.engine.submit(request, loop)]
            return list(self.engine.submit_n(request, n, loop))

    def submit_group(self, requests: Sequence[GenerationRequest], spare: int = 0,
                     group: int | None = None) -> Sequence[GenerationHandle]:
        """Requests of one prompt forked from one prefill (node/serving/conclave/)."""
        loop = asyncio.get_running_loop()
        with self._engine_errors():
            return list(self.engine.submit_group(requests, loop, spare=spare, group=group))

    def start_conclave(self, job: Job) -> ConclaveRun:
        """The job's Conclave with its first candidates submitted (failing as a submit does)."""
        run = ConclaveRun(self.submit_group, job.request, job.conclave, self.options.conclave)
        run.start()
        self.metrics.conclave_requests.inc()
        return run

    def submit_best_of(self, job: Job) -> Sequence[GenerationHandle]:
        """best_of candidates: the request's own sampling, seed + i, log-probabilities computed."""
        request = job.request
        if request.logprobs is None:
            request = dataclasses.replace(request, logprobs=0)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        return self.submit_group([
            dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=(seed + i) % SEED_SPACE))
            for i in range(job.best_of)])

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[None]:
        try:
            yield
        except engine_errors.EngineOverloaded as exc:
            raise Overloaded("Every slot and queue place is taken; retry shortly",
                             retry_after_s=exc.retry_after_s) from None
        except engine_errors.EngineClosed:
            raise Overloaded("The node is shutting down", retry_after_s=5) from None
        except engine_errors.PromptTooLong as exc:
            fits = exc.prompt_tokens < exc.n_ctx  # then a smaller max_tokens would do
            raise ContextLengthExceeded(str(exc), param="max_tokens" if fits else None) from None
        except engine_errors.InvalidRequest as exc:  # a bad sampling value, a grammar that does not compile
            raise InvalidRequest(short_error(exc)) from None

    async def prepare(self, job: Job, output: Output | None) -> None:
        """Compile the job's grammar against the vocabulary into the engine's cache on a grammar
        thread, within the budget (once per distinct grammar: later requests find it compiled),
        so neither the event loop nor the engine thread compiles, and a grammar that fails as
        generation starts is a 400 before anything is admitted."""
        spec = job.request.sampling.grammar
        prepare = getattr(self.engine, "prepare_grammar", None)
        if spec is None or prepare is None:
            return
        param = structure.CHECKED_FIELD.get(output.param, output.param) if output is not None else "grammar"
        warm = getattr(self.engine, "warm_grammars", None)
        if warm is not None:  # the vocabulary's view is built once, outside any grammar's budget
            await asyncio.get_running_loop().run_in_executor(None, warm)
        try:
            await self.grammar_workers.run(param, prepare, spec)
        except engine_errors.InvalidRequest as exc:
            raise InvalidRequest(short_error(exc), param=param, code="invalid_schema"
                                 if spec.kind == "json_schema" else "invalid_grammar") from None

    # ---- after a completed job --------------------------------------------------------

    def remember(self, job: Job, choices: list[StoredChoice], generated: list[tuple[int, ...]], *,
                 consensus: Mapping[str, Any] | None = None) -> None:
        if any(choice.finish_reason not in COMPLETED for choice in choices):
            return
        if job.key is not None and sum(choice.completion_tokens for choice in choices) > 0:
            record = encode_answer(StoredAnswer(len(job.prompt_tokens), tuple(choices), consensus))
            self._background("set", self.archive.set(job.key, record, self.options.l1_ttl_s))
        if self.options.observe:
            context = job.prompt_tokens[-self.options.observe_prompt_tokens:] if self.options.observe_prompt_tokens else ()
            namespace = self.model.fingerprint.encode()
            for tokens in generated:
                if tokens:
                    self._background("observe", self.archive.observe(namespace, (*context, *tokens)))

    def _background(self, operation: str, write: Coroutine[Any, Any, None]) -> None:
        if len(self._writes) >= self.options.max_pending_writes:
            write.close()
            self.metrics.background_dropped.inc()
            return
        task = asyncio.create_task(self._timed(operation, write))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _timed(self, operation: str, write: Coroutine[Any, Any, None]) -> None:
        started = time.perf_counter()
        await write
        self.metrics.archive_latency.labels(operation).observe(time.perf_counter() - started)

    @property
    def pending_writes(self) -> int:
        """Archive writes (L1 answers, L4 observations) not finished yet."""
        return len(self._writes)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for pending archive writes; used at shutdown and by tests."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)


def with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The messages with `text` at the start of the system message (one is added if none)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": text + "\n\n" + messages[0]["content"]}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]

