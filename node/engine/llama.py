"""Thin, typed wrapper over llama-cpp-python's low-level (ctypes) API.

Owns every call into libllama the engine makes: backend initialisation (once per
process), llama.cpp's system info, model load with a progress callback (and the buffer
types its weights went to), the vocabulary (tokenize, detokenize,
pieces with special tokens, end-of-generation ids), GGUF metadata, one context with a
unified KV cache shared by `n_seq_max` sequences, the KV memory operations, per-sequence
state save/restore, an embeddings context on the same weights (`EmbeddingContext`: embeddings on,
a pooling type set, one pooled vector per sequence), and `TokenBatch`, a llama_batch whose arrays are numpy buffers so a
step fills it with slice assignments instead of per-token ctypes calls.

Nothing here is thread-safe by itself: the context belongs to the engine thread; the
model's vocabulary is read-only once loaded and may be used from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

import llama_cpp as ll
from llama_cpp import llama_cpp as lib_module

from node.engine import huge_pages as thp
from node.engine.config import KV_TYPE_NAMES
from node.engine.errors import ModelLoadError
from node.engine.types import ModelInfo

log = logging.getLogger(__name__)

KV_TYPES: Mapping[str, int] = MappingProxyType(
    {"f16": ll.GGML_TYPE_F16, "q8_0": ll.GGML_TYPE_Q8_0, "q4_0": ll.GGML_TYPE_Q4_0}
)
assert tuple(KV_TYPES) == KV_TYPE_NAMES
# ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT; llama.cpp's chatty INFO goes to DEBUG.
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


_BUFFER_LINE = re.compile(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB")


class _Backend:
    """llama_backend_init once per process, and llama.cpp's log lines into `logging`.

    A thread may also `capture()` the lines it causes (a model load's buffer lines)."""

    def __init__(self) -> None:
        self._local = threading.local()

        @ll.llama_log_callback
        def forward(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            line = text.decode("utf-8", "replace").rstrip()
            if line:
                log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", line)
                captured = getattr(self._local, "lines", None)
                if captured is not None:
                    captured.append(line)

        self._callback = forward  # keep the C callback alive as long as the process
        ll.llama_log_set(forward, ctypes.c_void_p(0))  # first: the backend loader's lines go to the log too
        load_cpu_backends()
        ll.llama_backend_init()

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[str]]:
        lines: list[str] = []
        self._local.lines = lines
        try:
            yield lines
        finally:
            self._local.lines = None


def load_cpu_backends() -> None:
    """A build with runtime CPU dispatch (GGML_BACKEND_DL, GGML_CPU_ALL_VARIANTS: the portable
    image, docs/FLEET.md) links no CPU backend in: load the best variant this CPU can run from
    llama_cpp/lib, as llama.cpp's own programs do from their directory. A build with the
    backend linked in (the default, native build) has it registered already: nothing to do."""
    lib = lib_module._lib  # libllama, loaded with RTLD_GLOBAL: ggml's symbols resolve through it
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    if lib.ggml_backend_reg_count():
        return
    lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load_all_from_path.restype = None
    lib.ggml_backend_load_all_from_path(os.fsencode(str(lib_module._base_path)))
    if not lib.ggml_backend_reg_count():
        raise ModelLoadError(f"no llama.cpp CPU backend loads from {lib_module._base_path}")


def cpu_variant() -> str | None:
    """The CPU variant a runtime-dispatch build loaded (e.g. "haswell", "armv8.2_2"); None when
    the backend is linked in."""
    try:
        match = re.search(r"libggml-cpu-([^/\s]+)\.so", Path("/proc/self/maps").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def system_info() -> str:
    """llama.cpp's own account of the CPU features its kernels use (`CPU : AVX2 = 1 | ...`)."""
    backend()
    return (ll.llama_print_system_info() or b"").decode("utf-8", "replace").strip()


@functools.cache
def backend() -> _Backend:
    return _Backend()


class LlamaModel:
    """A loaded GGUF: weights plus vocabulary."""

    def __init__(self, path: Path, *, use_mmap: bool = True, use_mlock: bool = False,
                 progress: Callable[[float], object] | None = None, vocab_only: bool = False,
                 extra_buffers: bool = False, huge_pages: bool = False) -> None:
        """vocab_only: the vocabulary and metadata without the weights (to compare tokenizers).

        extra_buffers: let llama.cpp put weights in its extra buffer types (AMX tiles, CPU
        repacking into interleaved layouts). Off by default: on some hosts those kernels die
        by SIGILL, so only a caller that asked the kernel probe (node/engine/kernels.py)
        turns them on. `buffers` records the buffer types the weights went to (MiB each).

        huge_pages: read the weights into the process's memory (not mapped: `use_mmap` does
        not apply) and move them into 2 MiB pages (huge_pages.py); `collapsed` says how that
        went (None without)."""
        runtime = backend()
        if not Path(path).is_file():
            raise ModelLoadError(f"model file not found: {path}")
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        mapped = use_mmap and not huge_pages
        params.load_mode = (ll.LLAMA_LOAD_MODE_MMAP if mapped else ll.LLAMA_LOAD_MODE_NONE) | (
            ll.LLAMA_LOAD_MODE_MLOCK if use_mlock else 0
        )

        @ll.llama_progress_callback
        def on_progress(fraction: float, _user: ctypes.c_void_p) -> bool:
            if progress is not None:
                try:
                    return progress(float(fraction)) is not False
                except Exception:  # a broken progress bar must not abort the load
                    log.exception("model load progress callback failed")
            return True

        params.progress_callback = on_progress
        params.vocab_only = vocab_only
        params.use_extra_bufts = extra_buffers
        collapsing = huge_pages and not vocab_only
        before = thp.anonymous_mappings() if collapsing else set()
        with runtime.capture() as lines:
            self._ptr = ll.llama_model_load_from_file(os.fsencode(path), params)
        self.extra_buffers = extra_buffers
        self.buffers: dict[str, float] = {}
        sizes: list[int] = []
        for line in lines:
            match = _BUFFER_LINE.search(line)
            if match:
                mib = float(match.group(2))
                self.buffers[match.group(1)] = self.buffers.get(match.group(1), 0.0) + mib
                sizes.append(int(mib * 2**20))
        self.collapsed: thp.Collapsed | None = None
        if self._ptr and collapsing:
            self.collapsed = thp.collapse(thp.holding(thp.anonymous_mappings() - before, sizes))
            log.info("weights: %s", self.collapsed.describe())
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not load {path} (not a GGUF it supports?)")
        self.path = Path(path)
        self.vocab = ll.llama_model_get_vocab(self._ptr)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_swa = max(0, ll.llama_model_n_swa(self._ptr))  # sliding-window size, 0: none
        self.info = self._read_info()

    @property
    def ptr(self) -> ll.llama_model_p:
        return self._ptr

    @property
    def huge_mib(self) -> float | None:
        """MiB of the weights in huge pages (None: not asked for)."""
        return self.collapsed.huge / 2**20 if self.collapsed is not None else None

    # -- vocabulary ---------------------------------------------------------------------

    def tokenize(self, text: str | bytes, *, add_bos: bool = True, special: bool = True) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        capacity = len(data) + 8
        buf = (ll.llama_token * capacity)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_bos, special)
        if n < 0:
            capacity = -n
            buf = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_bos, special)
        return list(buf[:n])

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> bytes:
        if not tokens:
            return b""
        arr = (ll.llama_token * len(tokens))(*tokens)
        capacity = 16 * len(tokens) + 16
        buf = ctypes.create_string_buffer(capacity)
        n = ll.llama_detokenize(self.vocab, arr, len(tokens), buf, capacity, False, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_detokenize(self.vocab, arr, len(tokens), buf, -n, False, special)
        return buf.raw[:n]

    # -- metadata -------------------------------------------------------------------------

    def metadata(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in range(ll.llama_model_meta_count(self._ptr)):
            key = _read_string(lambda b, n: ll.llama_model_meta_key_by_index(self._ptr, i, b, n))
            out[key] = _read_string(lambda b, n: ll.llama_model_meta_val_str_by_index(self._ptr, i, b, n))
        return out

    def _read_info(self) -> ModelInfo:
        meta = self.metadata()
        vocab = self.vocab
        eog = frozenset(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(vocab, t))
        bos, eos = ll.llama_vocab_bos(vocab), ll.llama_vocab_eos(vocab)
        arch = meta.get("general.architecture", "unknown")
        return ModelInfo(
            name=meta.get("general.name") or self.path.stem,
            architecture=arch,
            n_vocab=self.n_vocab,
            n_ctx_train=ll.llama_model_n_ctx_train(self._ptr),
            bos=bos if bos >= 0 else None,
            eos=eos if eos >= 0 else None,
            eog_tokens=eog,
            add_bos=bool(ll.llama_vocab_get_add_bos(vocab)),
            chat_template=meta.get("tokenizer.chat_template"),
            metadata=MappingProxyType(meta),
        )

    def close(self) -> None:
        if self._ptr:
            ll.llama_model_free(self._ptr)
            self._ptr = None


def _read_string(fill: Callable[[ctypes.Array, int], int]) -> str:
    buf = ctypes.create_string_buffer(256)
    n = fill(buf, len(buf))
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        n = fill(buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


class LlamaContext:
    """One inference context with a unified KV cache for n_seq_max sequences."""

    def __init__(self, model: LlamaModel, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int,
                 n_threads: int, kv_type: str = "f16", swa_full: bool = False,
                 flash_attn: bool | None = None, max_outputs_per_seq: int = 1) -> None:
        """max_outputs_per_seq: logits rows one sequence may ask for in one decode (1 + drafts).

        flash_attn None: llama.cpp decides (on for CPU; a quantized V cache needs it).

        Either way llama.cpp's CPU kernels are not batch-invariant: a sequence decoded in
        the same ubatch as other sequences can get logits a few tenths apart from decoding
        alone (tests/node/engine/test_engine_batching.py measures how often greedy text differs).
        """
        if kv_type not in KV_TYPES:
            raise ModelLoadError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = min(n_ubatch, n_batch)
        params.n_seq_max = n_seq_max
        # logits rows per decode: a step has at most one row per sequence plus its drafts and
        # one per completing prompt; bounding them shrinks the buffers from n_batch x n_vocab
        # floats (512 MiB for Gemma) to a few MiB
        params.n_outputs_max_per_seq = max_outputs_per_seq
        params.n_outputs_max = n_seq_max * (max_outputs_per_seq + 1)
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn is None else
                                  ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.kv_unified = True
        params.swa_full = swa_full
        params.no_perf = True
        self._ptr = ll.llama_init_from_model(model.ptr, params)
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not create a context (n_ctx={n_ctx}, kv_type={kv_type})")
        self.model = model
        self.memory = ll.llama_get_memory(self._ptr)
        self.n_ctx = ll.llama_n_ctx(self._ptr)
        self.n_batch = ll.llama_n_batch(self._ptr)
        self.n_seq_max = ll.llama_n_seq_max(self._ptr)
        self.n_threads = n_threads
        self.n_vocab = model.n_vocab

    def set_threads(self, n_threads: int) -> None:
        """Threads for the following decodes (generation and batch alike)."""
        ll.llama_set_n_threads(self._ptr, n_threads, n_threads)
        self.n_threads = n_threads

    def decode(self, batch: TokenBatch) -> int:
        """llama_decode: 0 ok, 1 no KV room for the batch, 2 aborted, < 0 error."""
        return ll.llama_decode(self._ptr, batch.struct())

    def logits(self, n_outputs: int) -> np.ndarray:
        """The logits rows of the last decode, in batch order of the tokens that asked for them."""
        ptr = ll.llama_get_logits(self._ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))

    # -- KV memory ------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(ll.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        ll.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return ll.llama_memory_seq_pos_max(self.memory, seq)

    def seq_pos_min(self, seq: int) -> int:
        """The smallest position of `seq` still in the KV (sliding-window cells get reused)."""
        return ll.llama_memory_seq_pos_min(self.memory, seq)

    def clear(self) -> None:
        ll.llama_memory_clear(self.memory, True)

    # -- per-sequence state ---------------------------------------------------------------

    def _state_data(self, seq: int) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """seq's state written into a buffer of its own, and the bytes written."""
        size = ll.llama_state_seq_get_size(self._ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        return buf, ll.llama_state_seq_get_data(self._ptr, buf, size, seq)

    def state_get(self, seq: int) -> bytes:
        buf, written = self._state_data(seq)
        return bytes(memoryview(buf)[:written])

    def state_copy(self, src: int, dst: int) -> bool:
        """Make dst's KV a copy of src's in cells of its own (`seq_cp` shares the cells instead,
        and llama.cpp never reuses a sliding-window cell two sequences hold, even once it is
        outside both windows: shared windows of long sequences fill the SWA cache)."""
        buf, written = self._state_data(src)
        return written > 0 and ll.llama_state_seq_set_data(self._ptr, buf, written, dst) > 0

    def state_set(self, seq: int, state: bytes) -> bool:
        # llama.cpp reads the bytes object's own buffer (it only reads, and `state` outlives the
        # call): a copy into a ctypes array first cost as much as the restore itself.
        if not isinstance(state, bytes):
            state = bytes(state)
        src = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        return ll.llama_state_seq_set_data(self._ptr, src, len(state), seq) > 0

    def close(self) -> None:
        if self._ptr:
            ll.llama_free(self._ptr)
            self._ptr = None


class TokenBatch:
    """A llama_batch over numpy arrays: one seq id per token, logits flag per token."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.n_tokens = 0
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.wants_logits = np.zeros(capacity, dtype=np.int8)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        base = self.seq_ids.ctypes.data
        self._seq_ptrs = (ctypes.c_void_p * capacity)(*(base + 4 * i for i in range(capacity)))

    @property
    def room(self) -> int:
        return self.capacity - self.n_tokens

    def clear(self) -> None:
        self.n_tokens = 0

    def add(self, tokens: Sequence[int], start_pos: int, seq: int, *, logits: str = "last", known: int = 0) -> int:
        """Append tokens of one sequence; logits: "last", "all" or "none"; with "all", the first
        `known` tokens get none (the token after each is known already). Returns the first index."""
        n, first = len(tokens), self.n_tokens
        if n > self.room:
            raise ValueError(f"batch overflow: {n} tokens into {self.room} free places")
        end = first + n
        self.tokens[first:end] = tokens
        self.positions[first:end] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq_ids[first:end] = seq
        self.wants_logits[first:end] = 1 if logits == "all" else 0
        if known:
            self.wants_logits[first:first + known] = 0
        if logits == "last" and n:
            self.wants_logits[end - 1] = 1
        self.n_tokens = end
        return first

    def struct(self) -> ll.llama_batch:
        batch: Any = ll.llama_batch()  # llama_cpp declares these pointer fields as ctypes arrays
        batch.n_tokens = self.n_tokens
        batch.token = self.tokens.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        batch.embd = None
        batch.pos = self.positions.ctypes.data_as(ctypes.POINTER(ll.llama_pos))
        batch.n_seq_id = self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id)))
        batch.logits = self.wants_logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        return batch


POOLING_NAMES: Mapping[int, str] = MappingProxyType({
    ll.LLAMA_POOLING_TYPE_NONE: "none", ll.LLAMA_POOLING_TYPE_MEAN: "mean", ll.LLAMA_POOLING_TYPE_CLS: "cls",
    ll.LLAMA_POOLING_TYPE_LAST: "last", ll.LLAMA_POOLING_TYPE_RANK: "rank",
})


def model_pooling(model: LlamaModel) -> int:
    """The pooling type the GGUF declares (`<arch>.pooling_type`); LLAMA_POOLING_TYPE_NONE when
    it declares none (a generative model)."""
    value = model.info.metadata.get(f"{model.info.architecture}.pooling_type", "")
    try:
        return int(value)
    except ValueError:
        return ll.LLAMA_POOLING_TYPE_NONE


class EmbeddingContext:
    """A second context on the same weights, made for embeddings: `embeddings` on and a pooling
    type set, so llama.cpp pools the final hidden states (result_norm) of each sequence of a
    batch into one vector (`llama_get_embeddings_seq`). Its KV holds `n_tokens` cells, cleared
    before every batch: each input is decoded whole within one batch, one seq id each."""

    def __init__(self, model: LlamaModel, *, n_tokens: int, n_seq_max: int, n_threads: int, pooling: int) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = n_tokens
        params.n_batch = params.n_ubatch = n_tokens
        params.n_seq_max = n_seq_max
        params.n_outputs_max = n_tokens  # an embedding batch outputs every token
        params.n_threads = params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = pooling
        params.kv_unified = True
        params.swa_full = True
        params.no_perf = True
        self._ptr = ll.llama_init_from_model(model.ptr, params)
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not create an embeddings context ({n_tokens} tokens)")
        self.memory = ll.llama_get_memory(self._ptr)
        self.pooling = int(ll.llama_pooling_type(self._ptr))
        self.n_embd = int(ll.llama_model_n_embd_out(model.ptr))
        self.n_tokens = int(ll.llama_n_batch(self._ptr))
        self.n_seq_max = int(ll.llama_n_seq_max(self._ptr))

    def decode(self, batch: TokenBatch) -> int:
        """One batch from empty memory: 0 ok, else llama_decode's failure code."""
        ll.llama_memory_clear(self.memory, True)
        return ll.llama_decode(self._ptr, batch.struct())

    def pooled(self, seq: int) -> np.ndarray:
        """The pooled vector of one sequence of the last decode (a copy)."""
        ptr = ll.llama_get_embeddings_seq(self._ptr, seq)
        if not ptr:
            raise RuntimeError(f"llama.cpp returned no pooled embedding for sequence {seq}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def close(self) -> None:
        if self._ptr:
            ll.llama_free(self._ptr)
            self._ptr = None
