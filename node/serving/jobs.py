"""Running a plan's jobs: L1 lookup, grammar preparation, prefetch, engine submits, and the
one `finish()` after a job completes.

`Jobs` is what an `Answer` (node/serving/answer.py) and the group events (node/serving/
conclave/events.py) work with; neither sees the service. It owns what a running job touches:
the engine, the archive, the ledger (node/serving/ledger.py), the metrics, the prefix cache's
fleet tier and the session turns.

- `lookup(job)`: the job's L1 answer, or None (not keyed, a miss, or a record for another n).
- `prepare(job, output)`: the job's grammar compiled into the engine's cache on a grammar
  thread, within its budget, so a grammar that fails is a 400 before anything is admitted.
- `prefetch(tokens)`: the prompt's longest stored prefix brought into RAM by the fleet tier,
  bounded by `prefetch_timeout_s` (a slow archive costs only the speed-up).
- `submit(job)`, `submit_group(requests)`, `start_conclave(job)`, `submit_best_of(job)`:
  the engine's handles; the engine's typed errors become the serving layer's here and
  nowhere else (`engine_errors()`). A Conclave starts as the node's `conclave_starts` says
  (node/serving/conclave/start.py: its first candidates, or all at once where the last ones
  needed every candidate, half or more of them).
- `replayed(job, stored)`: an L1 answer served (the ledger counts it as replayed).
- `finish(job, choices, generated, computed=...)`: a generated job whose choices all ended,
  plain, Conclave or best_of alike: the generated tokens are counted (`computed`: every
  candidate's, for a group), the choices served in the ledger, and the answer remembered.

Remembering (once every choice finished with `stop` or `length`, never cancelled or failed):
two writes off the request's critical path, as background tasks bounded by
`ServiceOptions.max_pending_writes`: the answer goes to L1 (when keyed and non-empty), and
each choice's token stream is OBSERVEd into the L4 corpus under the model's fingerprint: the
last `observe_prompt_tokens` prompt tokens followed by every generated token, so later
drafts can continue from prompt context into the answer. `[arca] observe = false` turns
observing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from typing import Any, Coroutine, Iterator, Mapping, Sequence

from node.archive.client import ArchiveClient
from node.cache.fleet import FleetTier
from node.cache.prefix_cache import PrefixCache
from node.engine import errors as engine_errors
from node.engine.grammar_limits import short_error
from node.engine.types import COMPLETED, GenerationHandle, GenerationRequest
from node.serving import structure
from node.serving.conclave.runner import SEED_SPACE, ConclaveRun
from node.serving.conclave.start import StartRecord
from node.serving.engine_client import EngineClient
from node.serving.errors import ContextLengthExceeded, InvalidRequest, Overloaded
from node.serving.grammar_workers import GrammarWorkers
from node.serving.l1 import StoredAnswer, StoredChoice, decode_answer, encode_answer
from node.serving.ledger import Ledger
from node.serving.live_first import LiveFirst
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.options import ServiceOptions
from node.serving.plan import Job
from node.serving.prompts import Prompts
from node.serving.tenants import OPEN
from node.serving.requests import Output
from node.sessions.store import Sessions
from node.sessions.turns import SessionTurns
from node.sessions.warm import WarmResult, warm


class Jobs:
    def __init__(self, engine: EngineClient, archive: ArchiveClient, model: ServedModel, metrics: Metrics,
                 options: ServiceOptions, prompts: Prompts, *, cache: PrefixCache | None = None,
                 fleet: FleetTier | None = None, sessions: Sessions | None = None) -> None:
        self.engine = engine
        self.archive = archive
        self.model = model
        self.metrics = metrics
        self.options = options
        self.cache = cache  # None when the prefix cache is off
        self.fleet = fleet
        self.ledger = Ledger()  # what was served (node/serving/ledger.py)
        self.grammar_workers = GrammarWorkers()  # schema checks and grammar compiles, off the loop
        self.turns = (SessionTurns(sessions, model.template, prompts, cache, self.warm)
                      if sessions is not None else None)
        self._writes: set[asyncio.Task[None]] = set()
        self.live_first = LiveFirst(options.batch_interval_s)  # batch lines' loop work waits for live requests
        self.conclave_starts = StartRecord()  # how adaptive Conclaves start, from how the last ones went

    # ---- before the engine --------------------------------------------------------------

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
        warm_grammars = getattr(self.engine, "warm_grammars", None)
        if warm_grammars is not None:  # the vocabulary's view is built once, outside any grammar's budget
            await asyncio.get_running_loop().run_in_executor(None, warm_grammars)
        try:
            await self.grammar_workers.run(param, prepare, spec)
        except engine_errors.InvalidRequest as exc:
            raise InvalidRequest(short_error(exc), param=param, code="invalid_schema"
                                 if spec.kind == "json_schema" else "invalid_grammar") from None

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

    # ---- the engine -----------------------------------------------------------------------

    def submit(self, job: Job) -> Sequence[GenerationHandle]:
        return self.submit_request(job.request, job.n)

    def submit_request(self, request: GenerationRequest, n: int) -> Sequence[GenerationHandle]:
        loop = asyncio.get_running_loop()
        with self.engine_errors():
            if n == 1:
                return [self.engine.submit(request, loop)]
            return list(self.engine.submit_n(request, n, loop))

    def submit_group(self, requests: Sequence[GenerationRequest], spare: int = 0,
                     group: int | None = None) -> Sequence[GenerationHandle]:
        """Requests of one prompt forked from one prefill (node/serving/conclave/)."""
        loop = asyncio.get_running_loop()
        with self.engine_errors():
            return list(self.engine.submit_group(requests, loop, spare=spare, group=group))

    def start_conclave(self, job: Job) -> ConclaveRun:
        """The job's Conclave with its first candidates submitted (failing as a submit does)."""
        run = ConclaveRun(self.submit_group, job.request, job.conclave, self.options.conclave, self.conclave_starts)
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
    def engine_errors(self) -> Iterator[None]:
        """The engine's typed errors as the serving layer's (the one place they are converted)."""
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

    # ---- after a job ------------------------------------------------------------------

    def replayed(self, job: Job, stored: StoredAnswer) -> None:
        """An answer served from L1."""
        self.ledger.served(len(job.prompt_tokens), sum(c.completion_tokens for c in stored.choices), from_l1=True)

    def finish(self, job: Job, choices: Sequence[StoredChoice], generated: Sequence[tuple[int, ...]], *,
               computed: int, consensus: Mapping[str, Any] | None = None) -> None:
        """A generated job whose choices all ended: `computed` tokens generated (every candidate's,
        for a group), the choices served, the answer remembered."""
        self.metrics.generated_tokens.inc(computed)
        self.ledger.served(len(job.prompt_tokens), sum(c.completion_tokens for c in choices), from_l1=False)
        self.remember(job, choices, generated, consensus=consensus)

    def remember(self, job: Job, choices: Sequence[StoredChoice], generated: Sequence[tuple[int, ...]], *,
                 consensus: Mapping[str, Any] | None = None) -> None:
        if any(choice.finish_reason not in COMPLETED for choice in choices):
            return
        if job.key is not None and sum(choice.completion_tokens for choice in choices) > 0:
            record = encode_answer(StoredAnswer(len(job.prompt_tokens), tuple(choices), consensus))
            self.background("set", self.archive.set(job.key, record, self.options.l1_ttl_s))
        if self.options.observe:
            context = job.prompt_tokens[-self.options.observe_prompt_tokens:] if self.options.observe_prompt_tokens else ()
            namespace = self.model.fingerprint.encode()
            for tokens in generated:
                if tokens:
                    self.background("observe", self.archive.observe(namespace, (*context, *tokens)))

    def background(self, operation: str, write: Coroutine[Any, Any, None]) -> None:
        """An archive write off the request's path (dropped and counted past max_pending_writes)."""
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
