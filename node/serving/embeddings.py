"""Embeddings as the serving layer gives them: inputs -> token ids -> L1 per input -> engine -> vectors.

`Embeddings.embed(inputs, dimensions=None)` (what `CompletionService.embed` calls, for every
API that embeds) takes strings or token-id sequences and returns `(vectors, usage)`: a
float32 array of one L2-normalised row per input, in input order, and `EmbeddingUsage`.
Strings are tokenized as the model reads text (BOS when the model adds one, control-token
text kept as text). `dimensions` truncates each vector to its first `dimensions` components
and normalises it again (the way Matryoshka-trained models are read; for other models it is
a plain projection onto the first components), from 1 to the model's width.

Each distinct input is looked up in the archive under its own L1 key, apart from the
completions' keys (`reame:emb:` + sha256 over the model's content fingerprint, the pooling,
the tenant (node/serving/tenants.py) and the input's token ids), so an input the same key
sent before, alone or inside any other request, costs no compute. The record is the pooled vector before normalisation (little-endian float32
with a magic, a version, a length and a CRC); a record that does not verify is a miss. The
misses go to the engine in one submit (batched there, node/engine/embedder.py) and are
written back in one background task after the answer. Limits, each a 400 naming the input:
the number of inputs (`[embeddings] max_inputs`), tokens of all inputs together
(`max_request_tokens`), tokens of one input (the engine's batch, `batch_tokens`), an empty
input, token ids outside the vocabulary.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from node.engine import errors as engine_errors
from node.serving.errors import ContextLengthExceeded, GenerationFailed, InvalidRequest, Overloaded
from node.serving.jobs import Jobs
from node.serving.options import MAX_EMBEDDING_INPUTS, EmbeddingLimits
from shared.tokens import pack_tokens

KEY_PREFIX = b"reame:emb:"
KEY_VERSION = 1
MAGIC = b"REMB"
RECORD = struct.Struct("<4sBII")  # magic, version, n floats, crc32 of the floats
RECORD_VERSION = 1
OFF_LOOP_INPUTS = 32  # more inputs than this are tokenized on a worker thread

EmbeddingInput = str | Sequence[int]

__all__ = ["MAX_EMBEDDING_INPUTS", "EmbeddingInput", "EmbeddingLimits", "EmbeddingUsage", "Embeddings"]


@dataclass(frozen=True, slots=True)
class EmbeddingUsage:
    prompt_tokens: int  # tokens of every input (OpenAI's count; cached ones included)
    cached_tokens: int  # of which answered from the archive, computing nothing
    inputs: int
    cached_inputs: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens


def embedding_key(fingerprint: str, pooling: str, tokens: Sequence[int], tenant: str = "") -> bytes:
    """`tenant`: whose vector it is (node/serving/tenants.py; "" : the open tenant, unchanged keys)."""
    header = f"v={KEY_VERSION};kind=embedding;model={fingerprint};pooling={pooling}".encode()
    if tenant:
        header += f";tenant={tenant}".encode()
    digest = hashlib.sha256(header)
    digest.update(b"\x00")
    digest.update(pack_tokens(tokens))
    return KEY_PREFIX + digest.hexdigest().encode()


def encode_vector(vector: np.ndarray) -> bytes:
    data = np.ascontiguousarray(vector, dtype="<f4").tobytes()
    return RECORD.pack(MAGIC, RECORD_VERSION, len(vector), zlib.crc32(data)) + data


def decode_vector(value: bytes, n_embd: int) -> np.ndarray | None:
    """The stored vector, or None when the record does not verify (or has another width)."""
    if len(value) < RECORD.size:
        return None
    magic, version, n, crc = RECORD.unpack_from(value)
    data = value[RECORD.size:]
    if magic != MAGIC or version != RECORD_VERSION or n != n_embd or len(data) != 4 * n or zlib.crc32(data) != crc:
        return None
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def normalised(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Rows cut to `dimensions` (all when None) and scaled to length 1 (a zero row stays zero)."""
    rows = vectors[:, :dimensions] if dimensions is not None else vectors
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.where(norms > 0, norms, 1.0)).astype(np.float32)


class Embeddings:
    def __init__(self, jobs: Jobs, limits: EmbeddingLimits) -> None:
        self.jobs = jobs
        self.limits = limits

    def tokens(self, inputs: Sequence[EmbeddingInput]) -> list[tuple[int, ...]]:
        """Every input's token ids, checked against the limits (raises InvalidRequest)."""
        engine, model = self.jobs.engine, self.jobs.model
        if not inputs:
            raise InvalidRequest("'input' must hold at least one input", param="input", code="invalid_value")
        if len(inputs) > self.limits.max_inputs:
            raise InvalidRequest(f"'input' holds {len(inputs)} inputs; at most {self.limits.max_inputs} are "
                                 f"allowed ([embeddings] max_inputs)", param="input", code="invalid_value")
        add_bos = engine.model_info.add_bos
        max_tokens = engine.embedding_info.max_tokens
        out: list[tuple[int, ...]] = []
        total = 0
        for number, item in enumerate(inputs):
            if isinstance(item, str):
                if not item:
                    raise InvalidRequest(f"input {number} is an empty string", param="input", code="invalid_value")
                tokens = tuple(engine.tokenize(item, add_bos=add_bos, special=False))
            else:
                tokens = tuple(item)
                if not tokens:
                    raise InvalidRequest(f"input {number} is an empty token list", param="input",
                                         code="invalid_value")
                bad = [token for token in tokens if not 0 <= token < model.n_vocab]
                if bad:
                    raise InvalidRequest(f"input {number} holds token ids outside the vocabulary of "
                                         f"{model.n_vocab}: {bad[:5]}", param="input", code="invalid_value")
            if len(tokens) > max_tokens:
                raise ContextLengthExceeded(f"input {number} has {len(tokens)} tokens; an input may hold at most "
                                            f"{max_tokens} ([embeddings] batch_tokens)", param="input")
            total += len(tokens)
            if total > self.limits.max_request_tokens:
                raise ContextLengthExceeded(f"the inputs hold more than {self.limits.max_request_tokens} tokens "
                                            f"together ([embeddings] max_request_tokens)", param="input")
            out.append(tokens)
        return out

    def check_dimensions(self, dimensions: int | None) -> None:
        n_embd = self.jobs.engine.embedding_info.n_embd
        if dimensions is not None and not 1 <= dimensions <= n_embd:
            raise InvalidRequest(f"'dimensions' must be between 1 and {n_embd} (this model's width), got "
                                 f"{dimensions}", param="dimensions", code="invalid_value")

    async def embed(self, inputs: Sequence[EmbeddingInput], dimensions: int | None = None,
                    tenant: str = "") -> tuple[np.ndarray, EmbeddingUsage]:
        jobs = self.jobs
        self.check_dimensions(dimensions)
        if len(inputs) > OFF_LOOP_INPUTS:
            tokens = await asyncio.get_running_loop().run_in_executor(None, self.tokens, inputs)
        else:
            tokens = self.tokens(inputs)
        info = jobs.engine.embedding_info
        unique = list(dict.fromkeys(tokens))
        jobs.ledger.enter()
        jobs.live_first.enter()  # a live request: batch lines wait for their turn meanwhile
        try:
            keys = [embedding_key(jobs.model.fingerprint, info.pooling, t, tenant) for t in unique] \
                if jobs.options.l1_enabled else []
            found = await self._lookup(keys, info.n_embd) if keys else [None] * len(unique)
            vectors = {t: v for t, v in zip(unique, found) if v is not None}
            misses = [t for t in unique if t not in vectors]
            if misses:
                with jobs.engine_errors():
                    future = jobs.engine.embed(misses)
                try:
                    computed = await asyncio.wrap_future(future)
                except engine_errors.EngineClosed:
                    raise Overloaded("The node is shutting down", retry_after_s=5) from None
                except (RuntimeError, engine_errors.EngineError) as exc:
                    raise GenerationFailed(f"Embedding failed: {exc}") from None
                vectors.update(zip(misses, computed))
                if keys:
                    key_of = dict(zip(unique, keys))
                    jobs.background("set", self._store([(key_of[t], vectors[t]) for t in misses]))
            rows = normalised(np.stack([vectors[t] for t in tokens]), dimensions)
        finally:
            jobs.ledger.leave()
            jobs.live_first.leave()
        missed = set(misses)
        hit = [t not in missed for t in tokens]
        cached_tokens = sum(len(t) for t, h in zip(tokens, hit) if h)
        usage = EmbeddingUsage(sum(len(t) for t in tokens), cached_tokens, len(tokens), sum(hit))
        jobs.ledger.embedded(usage.prompt_tokens, usage.cached_tokens, all_cached=all(hit))
        metrics = jobs.metrics
        metrics.embedding_inputs.labels("hit").inc(usage.cached_inputs)
        metrics.embedding_inputs.labels("miss").inc(usage.inputs - usage.cached_inputs)
        metrics.embedding_tokens.labels("hit").inc(usage.cached_tokens)
        metrics.embedding_tokens.labels("miss").inc(usage.prompt_tokens - usage.cached_tokens)
        return rows, usage

    async def _lookup(self, keys: list[bytes], n_embd: int) -> list[np.ndarray | None]:
        archive = self.jobs.archive
        started = time.perf_counter()
        values = await asyncio.gather(*(archive.get(key) for key in keys))
        self.jobs.metrics.archive_latency.labels("get").observe(time.perf_counter() - started)
        return [decode_vector(value, n_embd) if value is not None else None for value in values]

    async def _store(self, records: list[tuple[bytes, np.ndarray]]) -> None:
        """One background task for all of a request's new vectors (never dropped one by one)."""
        archive, ttl = self.jobs.archive, self.jobs.options.l1_ttl_s
        for key, vector in records:
            await archive.set(key, encode_vector(vector), ttl)
