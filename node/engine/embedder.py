"""Embeddings in the engine: a queue of inputs, pooled vectors from batched decodes on the engine thread.

The scheduler (node/engine/scheduler.py) calls `step()` between generation steps while work
waits, on the thread that owns every llama context. Each step packs waiting inputs, oldest
request first, into one `llama_decode` of a context of its own (`EmbeddingContext`,
node/engine/llama.py), one seq id per input, and reads one pooled vector per input. The
context is created at the first step that needs it, so a node that never embeds holds no
buffers for it (its logits buffers cost 2 x n_vocab floats per batch token: the lm_head still
runs for every token of an embedding batch).

Pooling: the GGUF's own (`<arch>.pooling_type`: mean, cls or last) when it declares one, the
way the model was trained to be read; else mean pooling of the final hidden states (after the
output norm) over the input's tokens, which for a causal model weighs every token alike
where the last token alone would carry only its own position's view. A reranking model
(rank pooling) outputs scores, not vectors: it serves no embeddings.

An input is decoded whole inside one batch (llama.cpp pools within a batch), so an input
holds at most `batch_tokens` tokens; `submit` refuses longer ones. While generation is
active a step takes at most `BUSY_TOKENS` tokens (one input at least), so a streaming answer
waits one short batch at a time. Vectors come back as float32 as llama.cpp pooled them, not
normalised: the serving layer normalises.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

import llama_cpp as ll

from node.engine.errors import EngineClosed, EngineOverloaded, InvalidRequest
from node.engine.types import EmbeddingInfo
from node.engine.llama import POOLING_NAMES, EmbeddingContext, LlamaModel, TokenBatch, model_pooling

log = logging.getLogger(__name__)

BUSY_TOKENS = 64  # tokens of an embedding step while sequences are generating
COUNTERS = ("embedding_decodes", "embedding_inputs", "embedding_tokens", "embedding_ms")


@dataclass(slots=True)
class _Job:
    inputs: tuple[tuple[int, ...], ...]
    future: concurrent.futures.Future[np.ndarray]
    vectors: np.ndarray
    next_input: int = 0
    done: int = 0
    failed: bool = field(default=False)


class Embedder:
    def __init__(self, model: LlamaModel, *, batch_tokens: int, n_threads: int, max_queue: int,
                 max_seqs: int = 64) -> None:
        declared = model_pooling(model)
        if declared == ll.LLAMA_POOLING_TYPE_RANK:
            self.pooling, source = None, "model"
        elif declared in (ll.LLAMA_POOLING_TYPE_MEAN, ll.LLAMA_POOLING_TYPE_CLS, ll.LLAMA_POOLING_TYPE_LAST):
            self.pooling, source = declared, "model"
        else:
            self.pooling, source = ll.LLAMA_POOLING_TYPE_MEAN, "default"
        self._model = model
        self._batch_tokens = batch_tokens
        self._max_seqs = max(1, min(max_seqs, batch_tokens, 256))
        self._n_threads = n_threads
        self._max_queue = max_queue
        self.info = EmbeddingInfo(int(ll.llama_model_n_embd_out(model.ptr)),
                                  POOLING_NAMES.get(self.pooling, "rank") if self.pooling is not None else "rank",
                                  source, batch_tokens)
        self._ctx: EmbeddingContext | None = None
        self._batch: TokenBatch | None = None
        self._lock = threading.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._closed = False
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)

    # -- caller side (any thread) ------------------------------------------------------------

    def submit(self, inputs: Sequence[Sequence[int]], n_vocab: int) -> concurrent.futures.Future[np.ndarray]:
        """A future of the inputs' pooled vectors (n_inputs x n_embd float32); raises
        InvalidRequest for what can never run."""
        if self.pooling is None:
            raise InvalidRequest("this model is a reranker (rank pooling): it has no embeddings")
        if not inputs:
            raise InvalidRequest("no inputs to embed")
        for number, tokens in enumerate(inputs):
            if not tokens:
                raise InvalidRequest(f"input {number} is empty")
            if len(tokens) > self._batch_tokens:
                raise InvalidRequest(f"input {number} has {len(tokens)} tokens; an input may hold at most "
                                     f"{self._batch_tokens} ([embeddings] batch_tokens)")
            if min(tokens) < 0 or max(tokens) >= n_vocab:
                raise InvalidRequest(f"input {number} holds token ids outside 0..{n_vocab - 1}")
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        job = _Job(tuple(tuple(int(t) for t in tokens) for tokens in inputs), future,
                   np.zeros((len(inputs), self.info.n_embd), dtype=np.float32))
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is closed")
            if len(self._queue) >= self._max_queue:
                raise EngineOverloaded(f"{len(self._queue)} embedding requests already waiting; retry later")
            self._queue.append(job)
        return future

    def pending(self) -> bool:
        return bool(self._queue)

    def stats(self) -> dict[str, int]:
        return {"embedding_queued": len(self._queue),
                **{k: round(v) if k.endswith("_ms") else int(v) for k, v in self.counters.items()}}

    # -- engine thread ---------------------------------------------------------------------------

    def step(self, busy: bool) -> bool:
        """One batched decode of waiting inputs; False when nothing waited."""
        picked = self._pick(BUSY_TOKENS if busy else self._batch_tokens)
        if not picked:
            return False
        t0 = time.perf_counter()
        try:
            ctx, batch = self._context()
            batch.clear()
            for seq, (job, number) in enumerate(picked):
                batch.add(job.inputs[number], 0, seq, logits="all")
            rc = ctx.decode(batch)
        except Exception as exc:  # no context, a batch that does not fit: these requests fail, nothing else
            log.exception("embedding batch failed")
            for job, _ in picked:
                self._fail(job, exc)
            return True
        finally:
            self.counters["embedding_ms"] += (time.perf_counter() - t0) * 1000
        if rc != 0:
            for job, _ in picked:
                self._fail(job, RuntimeError(f"llama_decode failed (code {rc}) for an embedding batch"))
            return True
        self.counters["embedding_decodes"] += 1
        self.counters["embedding_inputs"] += len(picked)
        self.counters["embedding_tokens"] += batch.n_tokens
        for seq, (job, number) in enumerate(picked):
            if job.failed:
                continue
            try:
                job.vectors[number] = ctx.pooled(seq)
            except Exception as exc:
                self._fail(job, exc)
                continue
            job.done += 1
            if job.done == len(job.inputs) and job.future.set_running_or_notify_cancel():
                job.future.set_result(job.vectors)
        return True

    def _pick(self, budget: int) -> list[tuple[_Job, int]]:
        """Inputs for one batch, oldest job first, within `budget` tokens (one input at least);
        cancelled jobs leave the queue."""
        picked: list[tuple[_Job, int]] = []
        used = 0
        with self._lock:
            while self._queue and len(picked) < self._max_seqs:
                job = self._queue[0]
                if job.future.cancelled() or job.failed:
                    self._queue.popleft()
                    continue
                tokens = job.inputs[job.next_input]
                if picked and used + len(tokens) > budget:
                    break
                picked.append((job, job.next_input))
                used += len(tokens)
                job.next_input += 1
                if job.next_input == len(job.inputs):
                    self._queue.popleft()
        return picked

    def _context(self) -> tuple[EmbeddingContext, TokenBatch]:
        if self._ctx is None or self._batch is None:
            assert self.pooling is not None
            self._ctx = EmbeddingContext(self._model, n_tokens=self._batch_tokens, n_seq_max=self._max_seqs,
                                         n_threads=self._n_threads, pooling=self.pooling)
            if self._ctx.pooling != self.pooling:
                raise RuntimeError(f"llama.cpp pools with type {self._ctx.pooling}, not {self.pooling}")
            self._batch = TokenBatch(self._ctx.n_tokens)
        return self._ctx, self._batch

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if job.failed:
            return
        job.failed = True
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(exc)

    def close(self) -> None:
        """Fail what waits and free the context (after the engine thread has stopped)."""
        with self._lock:
            self._closed = True
            waiting, self._queue = list(self._queue), collections.deque()
        for job in waiting:
            self._fail(job, EngineClosed("the engine is closed"))
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
