"""The serving layer's face: a request planned, answered, embedded; nothing else calls in.

The work is done one way down, by three parts the service wires once:

- the planner (node/serving/planner.py): a validated request (node/serving/requests.py) ->
  a `Plan` (node/serving/plan.py), one `Job` per prompt, rendered, tokenized and (when
  deterministic) keyed for L1, for one tenant (node/serving/tenants.py: the API key the
  request came with; its L1 keys and prefix states are that tenant's alone);
- `answer(plan)`: the `Answer` (node/serving/answer.py) over the node's `Jobs` (node/serving/
  jobs.py): L1 lookup -> prefetch -> engine submit (plain, Conclave, best_of) -> events ->
  `finish()`, which counts, records the ledger and remembers (L1, L4) off the request path;
- `embed(inputs, dimensions=None)`: embeddings for every API that has them
  (node/serving/embeddings.py: L1 per input, the misses batched in the engine).

`verify(options)` runs the request's schema and grammar checks that cost time on a grammar
thread before planning (node/serving/structure.py). `warm(tokens)` prefills into the prefix
cache; `drain()` waits for pending archive writes. The ledger of what was served
(node/serving/ledger.py) and the session turns live on the jobs and are exposed here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from node.archive.client import ArchiveClient
from node.cache.fleet import FleetTier
from node.cache.prefix_cache import PrefixCache
from node.engine.types import INTERACTIVE, GrammarSpec
from node.serving import structure
from node.serving.answer import Answer
from node.serving.embeddings import EmbeddingInput, Embeddings, EmbeddingUsage
from node.serving.engine_client import EngineClient
from node.serving.jobs import Jobs
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.options import ServiceOptions
from node.serving.plan import Plan
from node.serving.planner import Planner
from node.serving.prompts import Prompts
from node.serving.requests import ChatRequest, CompletionRequest, GenerationOptions
from node.serving.tenants import OPEN
from node.sessions.store import Session, Sessions
from node.sessions.warm import WarmResult

__all__ = ["CompletionService", "Plan", "ServiceOptions"]


class CompletionService:
    def __init__(self, engine: EngineClient, archive: ArchiveClient, model: ServedModel, metrics: Metrics,
                 options: ServiceOptions = ServiceOptions(), *, cache: PrefixCache | None = None,
                 fleet: FleetTier | None = None, sessions: Sessions | None = None) -> None:
        self.engine, self.archive, self.model, self.metrics = engine, archive, model, metrics
        self.options, self.cache, self.fleet = options, cache, fleet  # cache: None when the prefix cache is off
        self.prompts = Prompts(model.template, engine)
        self.jobs = Jobs(engine, archive, model, metrics, options, self.prompts, cache=cache, fleet=fleet,
                         sessions=sessions)
        self.turns = self.jobs.turns
        self.ledger = self.jobs.ledger
        self.grammar_workers = self.jobs.grammar_workers
        self.live_first = self.jobs.live_first  # batch lines' loop work waits for live requests
        self.planner = Planner(engine, model, self.prompts, options, turns=self.turns,
                               final_states=cache is not None)
        self.embeddings = Embeddings(self.jobs, options.embeddings)
        self.verified = structure.Verified()

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

    # ---- planning, answering, embedding -----------------------------------------------

    def plan_completion(self, req: CompletionRequest, *, priority: int = INTERACTIVE, tenant: str = OPEN) -> Plan:
        return self.planner.plan_completion(req, priority=priority, tenant=tenant)

    def plan_chat(self, req: ChatRequest, session: Session | None = None, *, priority: int = INTERACTIVE,
                  tenant: str = OPEN) -> Plan:
        return self.planner.plan_chat(req, session, priority=priority, tenant=tenant)

    def answer(self, plan: Plan) -> Answer:
        return Answer(self.jobs, plan)

    async def embed(self, inputs: Sequence[EmbeddingInput], dimensions: int | None = None,
                    tenant: str = OPEN) -> tuple[np.ndarray, EmbeddingUsage]:
        """One L2-normalised float32 row per input (strings or token-id sequences), in order, cut
        to `dimensions` and normalised again when given (L1 within the tenant's scope); raises
        InvalidRequest (400) for inputs or dimensions out of bounds, Overloaded (503)."""
        return await self.embeddings.embed(inputs, dimensions, tenant)

    async def warm(self, tokens: Sequence[int], tenant: str = OPEN) -> WarmResult:
        """Prefill `tokens` into the tenant's prefix cache (node/sessions/warm.py)."""
        return await self.jobs.warm(tokens, tenant)

    @property
    def pending_writes(self) -> int:
        """Archive writes (L1 answers, L4 observations) not finished yet."""
        return self.jobs.pending_writes

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for pending archive writes; used at shutdown and by tests."""
        await self.jobs.drain(timeout_s)
