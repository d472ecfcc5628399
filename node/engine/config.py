"""What an engine is started with: one frozen dataclass, checked before anything is loaded.

Kept apart from the engine itself so the node's other layers (the loader, the serving
layer, tests with a fake engine) can read and build it without loading llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from node.engine.errors import InvalidRequest
from node.engine.hooks import PrefixCacheHook, Speculator

KV_TYPE_NAMES = ("f16", "q8_0", "q4_0")  # KV cache element types llama.cpp is asked for


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 4096                 # KV cells shared by all slots (unified cache)
    n_threads: int = 0                # 0: every core
    tune_threads: bool = False        # measure fewer threads online and use them when faster (threads.py)
    n_parallel: int = 4               # sequences decoded together (llama n_seq_max)
    n_batch: int = 512                # most tokens in one llama_decode
    n_ubatch: int = 512
    kv_type: str = "f16"              # f16 | q8_0 | q4_0
    use_mmap: bool = True
    use_mlock: bool = False
    huge_pages: str = "auto"          # weights read into 2 MiB pages: auto (where offered), on, off (huge_pages.py)
    max_queue: int = 64               # waiting requests beyond which submit raises EngineOverloaded
    step_token_budget: int = 256      # tokens per step while others are decoding (prefill chunk bound)
    prefix_cache: PrefixCacheHook | None = None
    speculator: Speculator | None = None
    max_draft: int = 0                # most draft tokens per sequence per step (0: no speculation)
    interactive_slots: int = 0        # slots batch-priority requests leave free for interactive ones
    seq_cells: int = 0                # most KV cells one sequence may use (prompt + max_tokens); 0: n_ctx // n_parallel
    group_slots: int = 0              # most slots one request (n, best_of, a Conclave) holds at once; 0: n_parallel - 1
    resident_prefixes: bool = True   # a free slot keeps its KV for the next prompt sharing its prefix
    shared_rows: bool = True          # identical siblings of a group draw from one row of logits (riders.py)
    swa_full: bool = False            # full-size sliding-window cache (llama.cpp swa_full)
    flash_attn: bool | None = None    # None: llama.cpp decides (see LlamaContext)
    extra_buffers: str = "auto"       # AMX / repack buffer types: auto (the kernel probe), on, off (kernels.py)
    kernel_cache: Path | None = None  # where the probe's verdicts are kept; None: <home>/kernels
    embed_batch_tokens: int = 256     # tokens of one embedding batch, and most tokens of one input (embedder.py)
    embed_max_queue: int = 64         # embedding requests waiting beyond which embed raises EngineOverloaded
    on_progress: Callable[[float], object] | None = None  # model load progress, 0.0 .. 1.0

    def check(self) -> None:
        for name in ("extra_buffers", "huge_pages"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise InvalidRequest(f"{name} must be auto, on or off, got {getattr(self, name)!r}")
        if self.kv_type not in KV_TYPE_NAMES:
            raise InvalidRequest(f"kv_type must be one of {', '.join(KV_TYPE_NAMES)}, got {self.kv_type!r}")
        if self.n_parallel < 1 or self.n_ctx < 16 or self.n_batch < 1 or self.max_queue < 1:
            raise InvalidRequest("n_parallel, n_ctx, n_batch and max_queue must be positive")
        if self.n_parallel * (1 + self.max_draft) > self.n_batch:
            raise InvalidRequest(f"n_batch {self.n_batch} cannot hold {self.n_parallel} sequences "
                                 f"with {self.max_draft} draft tokens each")
        if not 0 <= self.interactive_slots < self.n_parallel:
            raise InvalidRequest(f"interactive_slots must be in 0..{self.n_parallel - 1} (n_parallel - 1), "
                                 f"got {self.interactive_slots}")
        if self.embed_batch_tokens < 1 or self.embed_max_queue < 1:
            raise InvalidRequest("embed_batch_tokens and embed_max_queue must be positive")
        if not 0 <= self.seq_cells <= self.n_ctx or not 0 <= self.group_slots <= self.n_parallel:
            raise InvalidRequest(f"seq_cells must be in 0..n_ctx ({self.n_ctx}) and group_slots in 0..n_parallel "
                                 f"({self.n_parallel})")
        if not 0 < self.step_token_budget <= self.n_batch:
            raise InvalidRequest("step_token_budget must be in 1..n_batch")

    @property
    def cells_per_seq(self) -> int:
        """The per-sequence context: a sequence's prompt + max_tokens may not exceed it, so one
        request cannot reserve the cells every slot shares."""
        return self.seq_cells or max(16, self.n_ctx // self.n_parallel)

    @property
    def slots_per_group(self) -> int:
        """Slots the sequences of one request may hold at once: the others' share stays free."""
        return self.group_slots or max(1, self.n_parallel - 1)
