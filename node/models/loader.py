"""The engine's autoconfiguration: resolve the model and fit it to the host.

`plan_engine` is pure apart from reading the GGUF header and the host:
  - threads: the cores this process may use, minus one above four (room for the event loop);
  - parallel slots: `[server] parallel`, 0 = 4 (4 interleaved sequences measured 2.25x);
  - context: `[model] context_length`, 0 = the catalog default per sequence (else 4096),
    never above the model's training context, times the slots (one unified KV budget);
  - KV type: `[memory] kv_cache_type`, auto = the most precise of f16, q8_0, q4_0 whose
    KV fits in half of the RAM the model leaves free; an automatic context shrinks to fit.
Every decision is noted with its reason (`EnginePlan.notes`); node/assembly.py opens the engine
from the plan, with the prefix cache and the speculation controller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from node.engine import huge_pages
from node.models.ggufmeta import GGUFError, GGUFSummary, summarize
from node.config import NodeSettings
from node.models.catalog import ResolvedModel, resolve_model
from node.models.errors import ModelError


DEFAULT_CONTEXT = 4096
DEFAULT_PARALLEL = 4
MIN_CONTEXT = 256
KV_PREFERENCE = ("f16", "q8_0", "q4_0")
KV_RAM_SHARE = 0.5  # of the RAM left once the model is mapped


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
    available = huge_pages.available_ram()
    if available is not None:
        return available
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
