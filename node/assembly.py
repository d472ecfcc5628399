"""The one place a node is wired: engine, prefix cache, speculation, archive, fleet tier, L4
mirror, sessions, service and savings, opened in order and closed in reverse.

`Node.open(settings, *, engine=None, archive=None)` is an async context manager yielding the
`Node`; the HTTP app (node/api/app.py), the terminal chat and one-shot answers (node/cli/chat.py)
and a batch run with a local model (node/cli/batch.py) all open it, so every entry point
answers through the same service with the same tiers: L1 (exact answers), L3 (the prefix KV
cache and its fleet tier) and L4 (the corpus the archive draft source drafts from).

- The engine: `open_engine(settings)` resolves the model, autoconfigures it (node/models/
  loader.py), builds the prefix cache (keyed by the model's content fingerprint) and the
  speculation controller with its draft sources (`[speculative]`), and starts the Engine.
  An engine given to `Node.open` is the caller's: it is not closed, nor the prefix cache it
  was built with.
- The archive: `[arca] remote` (ARCA, Redis, Valkey) or embedded under `<home>/arca`; one
  given is the caller's.
- The fleet tier (node/cache/fleet.py), in front of the prefix cache: with a remote archive
  it fetches and pushes states through L3; with the embedded one it only preloads disk states
  into RAM (L3 in the embedded archive would be a second copy of the node's disk tier).
- The L4 mirror (node/archive/mirror.py), with speculation on, feeds the archive draft source
  (the Palimpsest) from the model's corpus; with a remote archive it keeps a local copy under
  `<home>/mirror` (one per server the corpus comes from).
- Sessions in the remote archive when there is one (node/sessions/archived.py), else under
  `<home>/sessions`.
- The savings sampler (node/serving/savings.py) runs while the node is open.

Closing order: sampler, pending archive writes, grammar threads, mirror, fleet pushes, engine,
prefix cache, archive. Every decision of the engine's autoconfiguration is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Callable

from node.archive.client import ArchiveClient, open_archive
from node.archive.mirror import CorpusMirror
from node.cache.fleet import FleetConfig, FleetTier
from node.cache.prefix_cache import PrefixCache
from node.config import NodeSettings
from node.models.errors import ModelError
from node.models.loader import EnginePlan, plan_engine
from node.serving.conclave.runner import ConclavePolicy
from node.serving.engine_client import EngineClient
from node.serving.flush import flush_pending
from node.serving.metrics import CacheStats, LiveStats, Metrics, SpeculationSeries
from node.serving.model import ServedModel, describe_model
from node.serving.options import EmbeddingLimits, ServiceOptions
from node.serving.savings import Savings, SavingsConfig
from node.serving.service import CompletionService
from node.sessions.archived import ArchivedSessionStore
from node.sessions.store import SessionLimits, Sessions, SessionStore
from node.speculative.controller import Controller
from node.speculative.cost_store import CostStore
from node.speculative.palimpsest import Palimpsest

if TYPE_CHECKING:  # the engine is imported when one is opened
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.source import DraftSource

log = logging.getLogger(__name__)

CALIBRATION_WAIT_S = 60.0  # the most a node waits for its first measure of the step costs before serving

STEP_TOKEN_BUDGET = 256  # prefill tokens per step while others decode: bounds their stall


@dataclass(frozen=True, slots=True)
class Node:
    """An open node: what every entry point answers through."""

    settings: NodeSettings
    engine: EngineClient
    cache: PrefixCache | None          # None when the prefix cache is off
    controller: Controller | None      # None when speculation is off
    archive: ArchiveClient
    fleet: FleetTier | None            # in front of the prefix cache, when there is one
    mirror: CorpusMirror | None        # feeds the archive draft source, when there is one
    sessions: Sessions
    model: ServedModel
    metrics: Metrics
    service: CompletionService
    savings: Savings
    started_at: float

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, settings: NodeSettings, *, engine: EngineClient | None = None,
                   archive: ArchiveClient | None = None,
                   on_progress: Callable[[float], object] | None = None) -> AsyncIterator[Node]:
        """The node the settings describe, closed on leaving; a given engine or archive stays the caller's.
        `on_progress` receives the model load fraction (0.0 .. 1.0) of an engine opened here."""
        loop = asyncio.get_running_loop()
        own_engine, own_archive = engine is None, archive is None
        if engine is None:
            opened: EngineClient = await loop.run_in_executor(None, partial(open_engine, settings,
                                                                            on_progress=on_progress))
            engine = opened
            if settings.speculative.measure_first:
                await wait_for_costs(engine)
        hook = engine.config.prefix_cache  # the node's prefix cache, when the engine was built with one
        cache = hook if isinstance(hook, PrefixCache) else None
        fleet: FleetTier | None = None
        mirror: CorpusMirror | None = None
        service: CompletionService | None = None
        sampler: asyncio.Task[None] | None = None
        try:
            if archive is None:
                archive = await loop.run_in_executor(None, open_archive, settings)
                await archive.start()
            model = await loop.run_in_executor(None, describe_model, engine, settings)
            metrics = Metrics()
            metrics.watch(LiveStats(engine.stats, partial(_errors, archive), archive.state))
            if cache is not None:
                remote = archive.state() != "embedded"
                fleet = FleetTier(cache, archive, FleetConfig(push=remote, fetch=remote))
                metrics.watch(CacheStats(cache.stats))
            speculator = engine.config.speculator
            controller = speculator if isinstance(speculator, Controller) else None
            if controller is not None:
                metrics.watch(SpeculationSeries(controller.stats.snapshot))
                mirror = await start_mirror(settings, archive, model.fingerprint, controller)
            sessions = await open_sessions(settings, archive)
            service = CompletionService(engine, archive, model, metrics, service_options(settings),
                                        cache=cache, fleet=fleet, sessions=sessions)
            warm_grammars = getattr(engine, "warm_grammars", None)
            if warm_grammars is not None:
                # the grammar engine's view of the vocabulary (~2 s of Python at 262,144 tokens), built
                # before the node serves: built beside the first request, it took a core from that
                # request's decode (a cold 1.8k-token prefill took 5.5 s instead of 4.5 s on 2 cores)
                await loop.run_in_executor(None, warm_grammars)
            savings = Savings(service.ledger, engine.stats, config=SavingsConfig(
                settings.stats.window_minutes, settings.stats.sample_seconds, settings.stats.log_minutes),
                drafts=partial(_accepted_drafts, controller) if controller is not None else None,
                plain_rate=controller.costs.plain_rate if controller is not None else None)
            sampler = asyncio.create_task(savings.run(), name="reame-savings")
            yield cls(settings, engine, cache, controller, archive, fleet, mirror, sessions, model, metrics,
                      service, savings, time.time())
        finally:
            if sampler is not None:
                sampler.cancel()
            if service is not None:
                await flush_pending(service, settings.server.shutdown_flush_s)
                service.grammar_workers.close()
            if mirror is not None:
                await mirror.close()
            if fleet is not None:
                await fleet.close()
            if own_engine:
                await loop.run_in_executor(None, engine.close)
                if cache is not None:
                    await loop.run_in_executor(None, cache.close)
            if own_archive and archive is not None:
                await archive.close()


def service_options(settings: NodeSettings) -> ServiceOptions:
    return ServiceOptions(
        observe=settings.arca.observe, observe_prompt_tokens=settings.arca.observe_prompt_tokens,
        l1_ttl_s=settings.arca.l1_ttl_s or None, conclave=ConclavePolicy.from_settings(settings.conclave),
        embeddings=EmbeddingLimits(settings.embeddings.max_inputs, settings.embeddings.max_request_tokens),
        max_queue_wait_s=settings.server.max_queue_wait_s)


async def wait_for_costs(engine: EngineClient) -> None:
    """Before the node serves, the engine's first calibration of the step costs, where no earlier
    start kept one (node/speculative/cost_store.py): it gives way to requests, and a node under
    load from its first second would plan every step on a default line without this host's
    staircase, never idle to measure it."""
    speculator = engine.config.speculator
    wait = getattr(engine, "wait_calibrated", None)
    if wait is None or not isinstance(speculator, Controller) or speculator.costs.measured:
        return
    started = time.monotonic()
    log.info("measuring this host's step costs before serving (once: kept for the next start)")
    if not await asyncio.get_running_loop().run_in_executor(None, wait, CALIBRATION_WAIT_S):
        log.warning("step costs not measured after %.0f s; serving on the default line", CALIBRATION_WAIT_S)
    elif speculator.costs.measured:
        log.info("step costs measured in %.1f s: %s", time.monotonic() - started, speculator.costs.describe())
    else:
        log.info("step costs not measured before serving (work was already waiting); measured when next idle")


async def open_sessions(settings: NodeSettings, archive: ArchiveClient) -> Sessions:
    """Sessions in the remote archive (any node continues any session), else under <home>/sessions."""
    limits = SessionLimits(max_sessions=settings.server.max_sessions,
                           max_per_owner=settings.server.max_sessions_per_client)
    if archive.state() != "embedded":
        return ArchivedSessionStore(archive, limits)
    return await asyncio.get_running_loop().run_in_executor(None, SessionStore.open, settings.home / "sessions",
                                                            limits)


def _accepted_drafts(controller: Controller) -> dict[str, int]:
    return {name: stats.accepted for name, stats in list(controller.stats.sources.items())}


async def start_mirror(settings: NodeSettings, archive: ArchiveClient, fingerprint: str,
                       controller: Controller) -> CorpusMirror | None:
    """Feed the archive draft source from the corpus: the fleet's (remote, with a local copy) or
    this node's own (embedded)."""
    palimpsest = controller.source("archive")
    if not isinstance(palimpsest, Palimpsest):
        return None
    remote = archive.state() != "embedded"
    # The local copy's cursor counts the streams of one server (an ARCA's ids, a Redis stream's
    # entry ids): each server the corpus comes from has a copy of its own.
    source = hashlib.blake2b(str(getattr(archive, "corpus_name", "")).encode(), digest_size=6).hexdigest()
    path = settings.home / "mirror" / f"{fingerprint}.{source}.l4" if remote else None
    legacy = settings.home / "mirror" / f"{fingerprint}.l4"  # one copy for the one ARCA, before
    if path is not None and archive.kind == "arca" and legacy.exists() and not path.exists():
        legacy.replace(path)
    mirror = CorpusMirror(archive, fingerprint.encode(), palimpsest.add, path=path,
                          max_tokens=palimpsest.max_tokens)
    await mirror.start()
    return mirror


def _errors(archive: ArchiveClient) -> dict[str, int]:
    return archive.counters.errors


# ---- the engine ------------------------------------------------------------------------


def prepare_directories(settings: NodeSettings) -> None:
    for directory in (settings.home / "models", settings.cache.directory):
        directory.mkdir(parents=True, exist_ok=True)


def build_prefix_cache(settings: NodeSettings, plan: EnginePlan) -> PrefixCache | None:
    """The prefix KV cache for this model and KV type, or None when disabled."""
    if not settings.cache.enabled:
        return None
    from node.cache.keys import engine_identity
    from node.cache.prefix_cache import PrefixCacheConfig
    from node.models.fingerprint import model_fingerprint

    identity = engine_identity(model_fingerprint(plan.model.path), plan.kv_type)
    return PrefixCache(identity, PrefixCacheConfig.from_settings(settings.cache))


def build_speculator(settings: NodeSettings, plan: EnginePlan) -> Controller | None:
    """The speculation controller with the configured draft sources, or None when it is off."""
    spec = settings.speculative
    if not spec.enabled or not spec.sources:
        return None
    max_draft = min(spec.max_draft, plan.n_batch // plan.n_parallel - 1)
    if max_draft < max(1, spec.min_draft):
        log.warning("speculation off: [model] batch %d leaves no room for drafts of %d sequences",
                    plan.n_batch, plan.n_parallel)
        return None
    from node.speculative.controller import ControllerConfig
    from node.speculative.format import Suggeritore
    from node.speculative.lookup import PromptLookup
    from node.speculative.siblings import SiblingDraft

    sources: list[DraftSource] = []
    lookup = PromptLookup()
    for name in spec.sources:
        if name == "lookup":  # the request's own text: its prompt, and its siblings' outputs
            sources.extend((lookup, SiblingDraft()))
        elif name == "archive" and spec.archive_tokens > 0:
            sources.append(Palimpsest(spec.archive_tokens, context_tokens=settings.arca.observe_prompt_tokens))
        elif name == "model":
            sources.append(open_draft_model(Path(spec.draft_model_path or ""), plan))
        elif name == "format":
            sources.extend(Suggeritore(lookup=lookup if "lookup" in spec.sources else None).sources())
    if not sources:
        return None
    return Controller(sources, ControllerConfig(max_draft=max_draft, min_draft=spec.min_draft,
                                                n_parallel=plan.n_parallel),
                      store=CostStore(cost_curve_path(settings, plan, max_draft)))


def cost_curve_path(settings: NodeSettings, plan: EnginePlan, max_draft: int) -> Path:
    """Where the calibrated verify cost curve is kept (node/speculative/cost_store.py): one file per
    model file, llama.cpp build, CPU, threads (the kernel verdict's key), kernel setting, slots
    and draft length, beside the kernel verdicts."""
    from node.engine.kernels import verdict_key

    threads = plan.n_threads or os.cpu_count() or 1
    text = f"{verdict_key(plan.model.path, threads)}:{settings.model.extra_buffers}:{plan.n_parallel}:{max_draft}"
    return settings.home / "kernels" / f"costs-{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def open_draft_model(path: Path, plan: EnginePlan) -> DraftSource:
    """The draft-model source, its vocabulary checked against the target's (ModelError if not)."""
    from node.engine.errors import ModelLoadError
    from node.speculative.draft_model import DraftModel

    try:
        return DraftModel(path.expanduser(), target_path=plan.model.path, n_ctx=plan.n_ctx,
                          n_parallel=plan.n_parallel, n_threads=plan.n_threads)
    except ModelLoadError as exc:
        raise ModelError(f"[speculative] draft_model_path {path}: {exc}") from exc


def engine_config(settings: NodeSettings, plan: EnginePlan, prefix_cache: PrefixCache | None = None,
                  progress: Callable[[float], object] | None = None,
                  speculator: Controller | None = None) -> EngineConfig:
    from node.engine.engine import EngineConfig

    return EngineConfig(
        model_path=plan.model.path, n_ctx=plan.n_ctx, n_threads=plan.n_threads,
        tune_threads=settings.model.threads == -1,
        n_parallel=plan.n_parallel, n_batch=plan.n_batch, n_ubatch=plan.n_ubatch,
        kv_type=plan.kv_type, use_mmap=settings.memory.use_mmap,
        use_mlock=settings.memory.use_mlock, huge_pages=settings.memory.huge_pages,
        max_queue=settings.server.max_queue,
        step_token_budget=min(STEP_TOKEN_BUDGET, plan.n_batch), prefix_cache=prefix_cache,
        on_progress=progress, speculator=speculator,
        max_draft=speculator.config.max_draft if speculator is not None else 0,
        interactive_slots=min(settings.batch.interactive_slots, plan.n_parallel - 1),
        extra_buffers=settings.model.extra_buffers, kernel_cache=settings.home / "kernels",
        embed_batch_tokens=settings.embeddings.batch_tokens, resident_prefixes=settings.cache.resident,
    )


def open_engine(settings: NodeSettings, *, progress: bool = True,
                on_progress: Callable[[float], object] | None = None) -> Engine:
    """Resolve, autoconfigure and start the engine the settings describe (blocking).

    `progress` shows a download bar on stderr when a catalog model must be fetched;
    `on_progress` receives the model load fraction (0.0 .. 1.0).
    """
    from node.engine.engine import Engine

    prepare_directories(settings)
    plan = plan_engine(settings, progress=progress)
    log.info("model %s: %s", plan.model.alias, "; ".join(plan.notes) or "as configured")
    cache = build_prefix_cache(settings, plan)
    try:
        speculator = build_speculator(settings, plan)
        if speculator is not None:
            log.info("speculation: sources %s, drafts of %d..%d tokens", ", ".join(speculator.source_names),
                     speculator.config.min_draft, speculator.config.max_draft)
        engine = Engine(engine_config(settings, plan, cache, on_progress, speculator))
        if speculator is not None:
            speculator.bind_vocabulary(engine.token_piece,
                                       lambda text: engine.tokenize(text, add_bos=False, special=False))
        return engine
    except BaseException:
        if cache is not None:
            cache.close()
        raise
