"""Opening the engine from the node's settings: resolve the model, fit it to the host, start it.

`plan_engine` is the autoconfiguration, pure apart from reading the GGUF header and the host:
  - threads: the cores this process may use, minus one above four (room for the event loop);
  - parallel slots: `[server] parallel`, 0 = 4 (4 interleaved sequences measured 2.25x);
  - context: `[model] context_length`, 0 = the catalog default per sequence (else 4096),
    never above the model's training context, times the slots (one unified KV budget);
  - KV type: `[memory] kv_cache_type`, auto = the most precise of f16, q8_0, q4_0 whose
    KV fits in half of the RAM the model leaves free; an automatic context shrinks to fit.
`open_engine` adds the prefix cache (keyed by the model's content fingerprint) and the
speculation controller with its draft sources (`[speculative]`), and starts the Engine. Every decision is logged with its reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from node.models.ggufmeta import GGUFError, GGUFSummary, summarize
from node.config import NodeSettings
from node.models.catalog import ModelError, ResolvedModel, resolve_model

if TYPE_CHECKING:  # the engine and the cache are imported when an engine is opened
    from node.cache.prefix_cache import PrefixCache
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller
    from node.speculative.source import DraftSource

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 4096
DEFAULT_PARALLEL = 4
MIN_CONTEXT = 256
KV_PREFERENCE = ("f16", "q8_0", "q4_0")
KV_RAM_SHARE = 0.5  # of the RAM left once the model is mapped
STEP_TOKEN_BUDGET = 256  # prefill tokens per step while others decode: bounds their stall


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """What the engine will be started with, and why (`notes`)."""

    model: ResolvedModel
    summary: GGUFSummary
    n_ctx: int
    n_threads: int
    n_parallel: int
    n_batch: int
    n_ubatch: int
    kv_type: str
    kv_bytes: int
    notes: tuple[str, ...]


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def auto_threads(cores: int) -> int:
    return cores - 1 if cores > 4 else cores


def available_ram() -> int:
    """Bytes of RAM available to new allocations (MemAvailable), or total RAM as a fallback."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _choose_kv(summary: GGUFSummary, n_ctx: int, wanted: str, budget: int) -> str:
    if wanted != "auto":
        return wanted
    for kv_type in KV_PREFERENCE:
        if summary.kv_bytes_per_token(kv_type) * n_ctx <= budget:
            return kv_type
    return KV_PREFERENCE[-1]


def plan_engine(settings: NodeSettings, *, cores: int | None = None, ram_bytes: int | None = None,
                fetch: bool = True, progress: bool = True) -> EnginePlan:
    """Resolve the model and choose every engine parameter left to `auto` (0) in settings."""
    model = resolve_model(settings.model.path, settings.home, fetch=fetch, progress=progress)
    try:
        summary = summarize(model.path)
    except GGUFError as exc:
        raise ModelError(str(exc)) from None
    notes: list[str] = []
    cores = cores or usable_cores()
    threads = settings.model.threads if settings.model.threads > 0 else auto_threads(cores)
    if settings.model.threads <= 0:
        notes.append(f"threads {threads} ({cores} cores)")
    parallel = settings.server.parallel or DEFAULT_PARALLEL
    per_seq = model.entry.context if model.entry else DEFAULT_CONTEXT
    if summary.n_ctx_train:
        per_seq = min(per_seq, summary.n_ctx_train)
    n_ctx = settings.model.context_length or per_seq * parallel
    if not settings.model.context_length:
        notes.append(f"context {n_ctx} ({per_seq} per sequence x {parallel} slots)")
    free = (ram_bytes if ram_bytes is not None else available_ram()) - model.path.stat().st_size
    budget = int(max(free, 0) * KV_RAM_SHARE)
    kv_type = _choose_kv(summary, n_ctx, settings.memory.kv_cache_type, budget)
    per_token = summary.kv_bytes_per_token(kv_type)
    if per_token * n_ctx > budget:
        if settings.model.context_length:
            notes.append(f"context {n_ctx} needs {per_token * n_ctx >> 20} MiB of KV, "
                         f"more than the {budget >> 20} MiB budget: expect swapping")
        else:
            n_ctx = max(MIN_CONTEXT, budget // per_token // MIN_CONTEXT * MIN_CONTEXT)
            notes.append(f"context shrunk to {n_ctx} to fit {budget >> 20} MiB of RAM")
    if settings.memory.kv_cache_type == "auto":
        notes.append(f"KV {kv_type} ({per_token * n_ctx >> 20} MiB for {n_ctx} tokens)")
    n_batch = settings.model.batch
    return EnginePlan(
        model=model, summary=summary, n_ctx=n_ctx, n_threads=threads, n_parallel=parallel,
        n_batch=n_batch, n_ubatch=min(settings.model.ubatch, n_batch), kv_type=kv_type,
        kv_bytes=per_token * n_ctx, notes=tuple(notes),
    )


def prepare_directories(settings: NodeSettings) -> None:
    for directory in (settings.home / "models", settings.cache.directory):
        directory.mkdir(parents=True, exist_ok=True)


def build_prefix_cache(settings: NodeSettings, plan: EnginePlan) -> PrefixCache | None:
    """The prefix KV cache for this model and KV type, or None when disabled."""
    if not settings.cache.enabled:
        return None
    from node.cache.keys import engine_identity
    from node.cache.prefix_cache import PrefixCache, PrefixCacheConfig
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
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.format import Suggeritore
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest

    sources: list[DraftSource] = []
    lookup = PromptLookup()
    for name in spec.sources:
        if name == "lookup":
            sources.append(lookup)
        elif name == "archive" and spec.archive_tokens > 0:
            sources.append(Palimpsest(spec.archive_tokens, context_tokens=settings.arca.observe_prompt_tokens))
        elif name == "model":
            sources.append(open_draft_model(Path(spec.draft_model_path or ""), plan))
        elif name == "format":
            sources.extend(Suggeritore(lookup=lookup if "lookup" in spec.sources else None).sources())
    if not sources:
        return None
    return Controller(sources, ControllerConfig(max_draft=max_draft, min_draft=spec.min_draft,
                                                n_parallel=plan.n_parallel))


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
        use_mlock=settings.memory.use_mlock, max_queue=settings.server.max_queue,
        step_token_budget=min(STEP_TOKEN_BUDGET, plan.n_batch), prefix_cache=prefix_cache,
        on_progress=progress, speculator=speculator,
        max_draft=speculator.config.max_draft if speculator is not None else 0,
        interactive_slots=min(settings.batch.interactive_slots, plan.n_parallel - 1),
        extra_buffers=settings.model.extra_buffers, kernel_cache=settings.home / "kernels",
        embed_batch_tokens=settings.embeddings.batch_tokens, resident_prefixes=settings.cache.resident,
    )


def open_engine(settings: NodeSettings, *, progress: bool = True,
                on_progress: Callable[[float], object] | None = None) -> Engine:
    """Resolve, autoconfigure and start the engine the settings describe.

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
