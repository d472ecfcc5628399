"""Opening the node's engine: the autoconfigured plan (node/models/loader.py), the prefix
cache (keyed by the model's content fingerprint) and the speculation controller with its
draft sources (`[speculative]`), then the Engine started. Every decision is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from node.cache.prefix_cache import PrefixCache
from node.config import NodeSettings
from node.models.catalog import ModelError
from node.models.loader import EnginePlan, plan_engine
from node.speculative.controller import Controller
from node.speculative.palimpsest import Palimpsest

if TYPE_CHECKING:  # the engine is imported when one is opened
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.source import DraftSource

log = logging.getLogger(__name__)

STEP_TOKEN_BUDGET = 256  # prefill tokens per step while others decode: bounds their stall


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
        embed_batch_tokens=settings.embeddings.batch_tokens,
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
