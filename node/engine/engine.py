"""The engine facade: load a model, start and stop the scheduler's thread, hand out request handles.

    engine = Engine(EngineConfig(model_path=path, n_parallel=4))
    handle = engine.submit(GenerationRequest(prompt_tokens=tuple(engine.tokenize("Hi"))))
    async for event in handle: ...        # TextDelta ..., then one Finished
    for event in handle.iter_sync(): ...  # the same, for blocking callers (submit without a loop)

`embed(token_lists)` returns a future of pooled vectors (one row per input) computed on the
engine thread between generation steps (node/engine/embedder.py); `embedding_info` says how.

`submit` validates what can be judged without the model running (empty prompt, token
ids, prompt + max_tokens against the per-sequence context `EngineConfig.cells_per_seq`, a
grammar that does not compile) and raises;
everything else that goes wrong for one request arrives as `Finished(reason="error")` on
its handle.

Grammars compile once per distinct spec (node/engine/grammar.py). `prepare_grammar(spec)`
compiles into the engine's bounded cache and is meant to run on a worker thread before
`submit` (the service does so), so neither the event loop nor the engine thread compiles.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator, Sequence as Seq

import numpy as np

from node.engine import compute_threads, huge_pages
from node.engine.config import EngineConfig
from node.engine.embedder import Embedder
from node.engine.errors import EngineClosed, InvalidRequest, PromptTooLong
from node.engine.grammar import CompiledGrammar, GrammarCompiler
from node.engine.kernels import choose_kernels
from node.engine.hooks import Draft, DraftSeq, PrefixCacheHook, Speculator
from node.engine.threads import ThreadTuner
from node.engine.llama import LlamaContext, LlamaModel, cpu_variant, system_info
from node.engine.sampling import fresh_seed, validate_params
from node.engine.limits import SchedulerLimits
from node.engine.scheduler import Scheduler
from node.engine.sequence import Channel, Sequence
from node.engine.types import EmbeddingInfo, Event, Finished, GenerationRequest, GrammarSpec, ModelInfo

__all__ = ["Draft", "DraftSeq", "Engine", "EngineConfig", "Handle", "ModelInfo", "PrefixCacheHook", "Speculator"]

log = logging.getLogger(__name__)


class Handle:
    """The caller's side of one generation: events out, cancel in."""

    def __init__(self, request_id: str, channel: Channel, scheduler: Scheduler, group: int = 0) -> None:
        self.request_id = request_id
        self.group = group  # the requests of one submit_n / submit_group share it
        self._channel = channel
        self._scheduler = scheduler
        self._finished = False

    def cancel(self) -> None:
        """Stop generating: the slot is freed at the next step, a Finished("cancelled") follows."""
        self._channel.cancelled = True
        self._scheduler.wake()

    async def started(self) -> int:
        """Wait until the generation holds a slot or has ended; > 0: it ended unstarted because
        no room came free within its `max_wait_s`, retry after that many seconds."""
        return await self._channel.started()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._finished:
            raise StopAsyncIteration
        event = await self._channel.get()
        self._finished = isinstance(event, Finished)
        return event

    def iter_sync(self, timeout: float | None = None) -> Iterator[Event]:
        while not self._finished:
            event = self._channel.get_sync(timeout)
            self._finished = isinstance(event, Finished)
            yield event

    async def collect(self) -> tuple[str, Finished]:
        """All text, and the Finished event (convenience for non-streaming callers)."""
        parts: list[str] = []
        async for event in self:
            if isinstance(event, Finished):
                return "".join(parts), event
            parts.append(event.text)
        raise RuntimeError("handle ended without Finished")


class Engine:
    """One model, one context, one scheduler thread."""

    def __init__(self, config: EngineConfig) -> None:
        config.check()
        self.config = config
        self._ctx_threads = config.n_threads or os.cpu_count() or 1
        self.kernels = choose_kernels(config.model_path, setting=config.extra_buffers,
                                      cache_dir=config.kernel_cache, n_threads=self._ctx_threads)
        self._model = LlamaModel(config.model_path, use_mmap=config.use_mmap, use_mlock=config.use_mlock,
                                 progress=config.on_progress, extra_buffers=self.kernels.extra_buffers,
                                 huge_pages=huge_pages.wanted(config.huge_pages, huge_pages.file_size(config.model_path)))
        try:
            self._ctx = LlamaContext(
                self._model, n_ctx=config.n_ctx, n_batch=config.n_batch, n_ubatch=config.n_ubatch,
                n_seq_max=config.n_parallel, n_threads=self._ctx_threads,
                kv_type=config.kv_type, swa_full=config.swa_full, flash_attn=config.flash_attn,
                max_outputs_per_seq=1 + config.max_draft)
        except Exception:
            self._model.close()
            raise
        self._embedder = Embedder(self._model, batch_tokens=config.embed_batch_tokens, n_threads=self._ctx_threads,
                                  max_queue=config.embed_max_queue)
        self._scheduler = Scheduler(
            self._model, self._ctx,
            SchedulerLimits(config.n_parallel, config.max_queue, config.step_token_budget, config.max_draft,
                            config.interactive_slots, config.slots_per_group, config.resident_prefixes,
                            config.shared_rows),
            prefix_cache=config.prefix_cache, speculator=config.speculator,
            threads=ThreadTuner(self._ctx_threads) if config.tune_threads else None, embedder=self._embedder,
            when_idle=compute_threads.when_idle)
        self._thread = threading.Thread(target=self._scheduler.run, name="reame-engine", daemon=True)
        self._thread.start()
        if others := compute_threads.opened(id(self), self._scheduler.wake):
            log.info("engine: %d other engine(s) open in this process: an idle one lets its llama.cpp "
                     "threads go (node/engine/compute_threads.py)", others)
        self.grammars = GrammarCompiler(self._model.vocab, self._model.n_vocab, self._model.info.eog_tokens)
        self._closed = False
        self._ids = itertools.count(1)
        self._keys = itertools.count(1)
        self._groups = itertools.count(1)

    # -- model ---------------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo:
        return self._model.info

    @property
    def vocab(self) -> object:
        """The model's llama.cpp vocabulary (read only; benchmarks hand it to llama.cpp's samplers)."""
        return self._model.vocab

    @property
    def n_ctx(self) -> int:
        return self._ctx.n_ctx

    def wait_calibrated(self, timeout_s: float) -> bool:
        """Wait until the engine thread has made its first calibration of the step costs (the
        speculator's, before any step; it gives way to requests already waiting); False when
        `timeout_s` passed first."""
        return self._scheduler.first_calibration.wait(timeout_s)

    def kernel_report(self) -> dict:
        """The kernel path: llama.cpp's CPU features, extra buffer types in use and why, the
        buffer types the weights went to (node/engine/kernels.py)."""
        return self.kernels.report(system_info(), self._model.buffers, cpu_variant(), self._model.huge_mib)

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Seq[int]) -> bytes:
        return self._model.detokenize(tokens)

    def token_piece(self, token: int) -> bytes:
        return self._scheduler.piece(token)

    # -- requests -------------------------------------------------------------------------------

    def submit(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        return self.submit_n(req, 1, loop=loop)[0]

    def submit_n(self, req: GenerationRequest, n: int,
                 loop: asyncio.AbstractEventLoop | None = None) -> list[Handle]:
        """n generations of one request sharing one prefill (forks of the first).

        Choice 0 uses the request's seed; choice i uses seed + i, so sampled choices differ
        and the whole set is reproducible when a seed is given.
        """
        if self._closed:
            raise EngineClosed("the engine is closed")
        if n < 1:
            raise InvalidRequest(f"n must be >= 1, got {n}")
        self._validate(req, n)
        loop = loop if loop is not None else _running_loop()
        base_seed = req.sampling.seed if req.sampling.seed is not None else fresh_seed()
        spec = req.sampling.grammar  # compiled here unless prepared: a grammar that does not compile fails the submit
        compiled = self.grammars.compile(spec) if spec is not None else None
        grammars = [compiled.matcher() if compiled is not None else None for _ in range(n)]
        handles, seqs = [], []
        group = next(self._groups)
        for i in range(n):
            request_id = req.request_id or f"req-{next(self._ids)}"
            if n > 1:
                request_id = f"{request_id}/{i}"
            channel = Channel(loop, self._scheduler.outbox)
            seqs.append(Sequence(req, channel, seed=base_seed + i, constraint=grammars[i],
                                 key=next(self._keys), group=group))
            handles.append(Handle(request_id, channel, self._scheduler, group))
        self._scheduler.enqueue(seqs)
        return handles

    def submit_group(self, reqs: Seq[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None, *,
                     spare: int = 0, group: int | None = None) -> list[Handle]:
        """Generations of one prompt with parameters of their own, sharing one prefill.

        Every request must have the same prompt tokens; each samples with its own seed (a
        fresh one when None). `spare`: requests of this prompt that may join later, whose KV
        cells are reserved now with these. `group`: join a group an earlier call returned
        (`Handle.group`): while one of its members still holds the prompt in the KV, a
        joiner clones it instead of prefilling, and all of them draft for each other.
        """
        if self._closed:
            raise EngineClosed("the engine is closed")
        if not reqs:
            raise InvalidRequest("a group needs at least one request")
        prompt = reqs[0].prompt_tokens
        if any(req.prompt_tokens != prompt for req in reqs):
            raise InvalidRequest("the requests of a group must share one prompt")
        if spare < 0:
            raise InvalidRequest(f"spare must be >= 0, got {spare}")
        for req in reqs:
            self._validate(req, 1)
        longest = max(req.max_tokens for req in reqs)
        # what the group reserves at most: the prompt, the candidates it runs at once and the spare
        at_once = min(len(reqs), self.config.slots_per_group) + spare
        limit = min(self._ctx.n_ctx, self.config.slots_per_group * self.config.cells_per_seq)
        need = len(prompt) + at_once * (longest + self.config.max_draft + 1)
        if group is None and need > limit:
            raise PromptTooLong(len(prompt), at_once * longest, limit,
                                f" one request may hold ({self.config.slots_per_group} slots of "
                                f"{self.config.cells_per_seq})")
        loop = loop if loop is not None else _running_loop()
        joining = group is not None
        group_id = group if group is not None else next(self._groups)
        per_fork = longest + self.config.max_draft + 1
        handles, seqs = [], []
        compiled: dict[GrammarSpec, CompiledGrammar] = {}
        for req in reqs:  # compiled here unless prepared: a grammar that does not compile fails the submit
            spec = req.sampling.grammar
            if spec is not None and spec not in compiled:
                compiled[spec] = self.grammars.compile(spec)
        for i, req in enumerate(reqs):
            spec = req.sampling.grammar
            grammar = compiled[spec].matcher() if spec is not None else None
            seed = req.sampling.seed if req.sampling.seed is not None else fresh_seed()
            request_id = req.request_id or f"req-{next(self._ids)}"
            channel = Channel(loop, self._scheduler.outbox)
            seqs.append(Sequence(req, channel, seed=seed, constraint=grammar, key=next(self._keys), group=group_id,
                                 spare=spare * per_fork if i == 0 else 0, fork=joining or i > 0))
            handles.append(Handle(request_id, channel, self._scheduler, group_id))
        self._scheduler.enqueue(seqs)
        return handles

    @property
    def embedding_info(self) -> EmbeddingInfo:
        return self._embedder.info

    def embed(self, inputs: Seq[Seq[int]]) -> concurrent.futures.Future[np.ndarray]:
        """Pooled vectors of the inputs' token ids (n_inputs x n_embd float32, not normalised),
        computed in batches on the engine thread; raises InvalidRequest for an input that can never
        run (empty, over `embed_batch_tokens`, ids outside the vocabulary), EngineOverloaded."""
        if self._closed:
            raise EngineClosed("the engine is closed")
        future = self._embedder.submit(inputs, self._model.n_vocab)
        self._scheduler.wake()
        return future

    def warm_grammars(self) -> None:
        """Build the grammar engine's view of the vocabulary now (seconds at 262,144 tokens), so
        the first structured request does not wait for it; blocking: call it on a worker thread."""
        try:
            if not self._closed:
                self.grammars.tokenizer()
        except InvalidRequest:  # closed while building: nothing to warm any more
            pass

    def prepare_grammar(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile a grammar into the engine's cache (blocking: call it on a worker thread);
        raises InvalidRequest with the reason when it does not compile."""
        return self.grammars.compile(spec)

    def _validate(self, req: GenerationRequest, n: int) -> None:
        if not req.prompt_tokens:
            raise InvalidRequest("the prompt is empty")
        if req.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {req.max_tokens}")
        n_vocab = self._model.n_vocab
        if min(req.prompt_tokens) < 0 or max(req.prompt_tokens) >= n_vocab:
            raise InvalidRequest(f"prompt token ids must be in 0..{n_vocab - 1}")
        validate_params(req.sampling, n_vocab)  # a 400 at submit, not a failure inside the engine thread
        per_seq = self.config.cells_per_seq
        if len(req.prompt_tokens) + req.max_tokens > per_seq:
            raise PromptTooLong(len(req.prompt_tokens), req.max_tokens, per_seq, " per sequence")
        # n > 1: the prompt once and the choices the request runs at once (the rest wait their turn)
        need = len(req.prompt_tokens) + min(n, self.config.slots_per_group) * (req.max_tokens + self.config.max_draft)
        if need > self._ctx.n_ctx:
            raise PromptTooLong(len(req.prompt_tokens), n * req.max_tokens, self._ctx.n_ctx)

    def stats(self) -> dict[str, int | float]:
        return {**self._scheduler.stats(), **self._embedder.stats(), **self.grammars.stats()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        compute_threads.closed(id(self))
        self.grammars.close()
        self._scheduler.stop()
        self._thread.join()
        self._embedder.close()
        self._ctx.close()
        self._model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
