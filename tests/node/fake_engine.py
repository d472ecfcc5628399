"""A fake engine for tests of the layers above the engine: no model, no llama.cpp, no threads.

It implements node/serving/engine_client.py's `EngineClient` with a byte vocabulary (ids
0-255 are the bytes, 256 is BOS, 257 the end of generation) and a scripted answer: a prompt
of P tokens is answered "Fake answer to P tokens." followed by the end of generation, cut
by max_tokens or a stop string, streamed one token per event loop turn. The answer depends
only on the prompt, so it is deterministic whatever the sampling parameters, which is what
the tests of L1, sessions, the service and the HTTP layer need; what the model itself does
is tested on the real Gemma model.

Knobs a test sets: `refuse` (an engine error every submit raises), `fail_after` (end every
generation with an error after that many tokens), `hold` (an asyncio.Event the generation
waits on before its first token), `token_delay_s` (seconds per token, for work that must
still be running when a test acts), `answers` (a function giving each request's answer text,
e.g. by its seed, for Conclave tests), `logprob` (the same for the tokens' logprob). `submitted` records every request that reached it,
`groups` the requests of each `submit_group` call, `embedded` every input `embed` computed
(a byte histogram folded onto 8 components: deterministic, similar texts alike).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from node.engine.config import EngineConfig
from node.engine.errors import EngineError, InvalidRequest, PromptTooLong
from node.engine.types import (
    EmbeddingInfo, Event, Finished, FinishReason, GenerationRequest, ModelInfo, TextDelta, TokenLogprob,
)

BOS, EOG = 256, 257
N_VOCAB = 258
FAKE_WIDTH = 8  # components of the fake embeddings


class FakeHandle:
    def __init__(self, engine: "FakeEngine", req: GenerationRequest, group: int = 0) -> None:
        self.engine = engine
        self.req = req
        self.group = group
        self.cancelled = False
        self._events = self._run()

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events

    async def _run(self) -> AsyncIterator[Event]:
        req, engine = self.req, self.engine
        if engine.hold is not None:
            await engine.hold.wait()
        answer = engine.answers(req) if engine.answers is not None else f"Fake answer to {len(req.prompt_tokens)} tokens."
        script = [*answer.encode(), EOG]
        generated: list[int] = []
        text = ""
        reason: FinishReason = "length"
        ended_by_eog = False
        for token in script[:req.max_tokens]:
            await asyncio.sleep(engine.token_delay_s)
            if self.cancelled:
                reason = "cancelled"
                break
            if engine.fail_after is not None and len(generated) >= engine.fail_after:
                yield Finished("error", len(req.prompt_tokens), len(generated), tuple(generated), "fake failure")
                return
            if token == EOG:
                reason, ended_by_eog = "stop", True
                break
            generated.append(token)
            piece = chr(token)
            stop = next((s for s in req.stop if s in text + piece), None)
            if stop is not None:
                kept = (text + piece)[:(text + piece).index(stop)][len(text):]
                if kept:
                    yield TextDelta(kept, ())
                reason = "stop"
                break
            text += piece
            logprobs: tuple[TokenLogprob, ...] = ()
            if req.logprobs is not None:
                top = tuple((t, bytes([t]), -0.5 - i) for i, t in enumerate(sorted({token, 32, 46})[:req.logprobs]))
                chosen = engine.logprob(req) if engine.logprob is not None else -0.5
                logprobs = (TokenLogprob(token, bytes([token]), chosen, top),)
            yield TextDelta(piece, (token,), logprobs)
        completion = len(generated) + int(ended_by_eog)  # an end-of-generation token counts, unseen
        yield Finished(reason, len(req.prompt_tokens), completion, tuple(generated))


class FakeEngine:
    """Satisfies EngineClient; `model_path` must be a file (its content is the fingerprint)."""

    def __init__(self, model_path: Path, *, n_ctx: int = 2048) -> None:
        if not model_path.exists():
            model_path.write_bytes(b"fake gguf for tests")
        self._config = EngineConfig(model_path=model_path, n_ctx=n_ctx)
        self._info = ModelInfo(name="fake", architecture="gemma3", n_vocab=N_VOCAB, n_ctx_train=n_ctx,
                               bos=BOS, eos=EOG, eog_tokens=frozenset({EOG}), add_bos=True, chat_template=None)
        self.submitted: list[GenerationRequest] = []
        self.refuse: EngineError | None = None
        self.fail_after: int | None = None
        self.hold: asyncio.Event | None = None
        self.token_delay_s = 0.0
        self.answers: Callable[[GenerationRequest], str] | None = None  # the answer per request, else the script
        self.logprob: Callable[[GenerationRequest], float] | None = None  # each token's logprob, else -0.5
        self.groups: list[list[GenerationRequest]] = []  # every submit_group call's requests
        self.embedded: list[tuple[int, ...]] = []  # every input embed() computed
        self._group_ids = 0
        self.closed = False

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    @property
    def n_ctx(self) -> int:
        return self._config.n_ctx

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return ([BOS] if add_bos else []) + list(text.encode("utf-8"))

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return bytes(t for t in tokens if t < 256)

    def token_piece(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""

    def submit(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> FakeHandle:
        return self.submit_n(req, 1, loop)[0]

    def submit_n(self, req: GenerationRequest, n: int,
                 loop: asyncio.AbstractEventLoop | None = None) -> list[FakeHandle]:
        if self.refuse is not None:
            raise self.refuse
        if len(req.prompt_tokens) + n * req.max_tokens > self.n_ctx:
            raise PromptTooLong(len(req.prompt_tokens), n * req.max_tokens, self.n_ctx)
        grammar = req.sampling.grammar
        if grammar is not None and grammar.kind == "gbnf" and not grammar.text.startswith("root ::="):
            raise InvalidRequest("the grammar does not parse as GBNF (llama.cpp grammar syntax)")
        self.submitted.extend([req] * n)
        return [FakeHandle(self, req) for _ in range(n)]

    def submit_group(self, reqs: Sequence[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None, *,
                     spare: int = 0, group: int | None = None) -> list[FakeHandle]:
        if self.refuse is not None:
            raise self.refuse
        prompt = len(reqs[0].prompt_tokens)
        if group is None and prompt + (len(reqs) + spare) * max(r.max_tokens for r in reqs) > self.n_ctx:
            raise PromptTooLong(prompt, (len(reqs) + spare) * reqs[0].max_tokens, self.n_ctx)
        if group is None:
            self._group_ids += 1
            group = self._group_ids
        self.groups.append(list(reqs))
        self.submitted.extend(reqs)
        return [FakeHandle(self, req, group) for req in reqs]

    @property
    def embedding_info(self) -> EmbeddingInfo:
        return EmbeddingInfo(n_embd=FAKE_WIDTH, pooling="mean", pooling_source="default", max_tokens=self.n_ctx)

    def embed(self, inputs: Sequence[Sequence[int]]) -> concurrent.futures.Future[np.ndarray]:
        """Each input's byte histogram folded onto FAKE_WIDTH components (a deterministic, not
        normalised vector); `embedded` records every input that reached it."""
        if self.refuse is not None:
            raise self.refuse
        self.embedded.extend(tuple(tokens) for tokens in inputs)
        vectors = np.zeros((len(inputs), FAKE_WIDTH), dtype=np.float32)
        for row, tokens in enumerate(inputs):
            for token in tokens:
                vectors[row, token % FAKE_WIDTH] += 1.0
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        future.set_result(vectors)
        return future

    def stats(self) -> Mapping[str, int]:
        return {"active": 0, "queued": 0, "submitted": len(self.submitted), "embedding_tokens":
                sum(len(tokens) for tokens in self.embedded)}

    def kernel_report(self) -> Mapping[str, object]:
        return {"machine": "fake", "features": [], "extra_buffers": "off", "setting": "off",
                "reason": "a fake engine runs no kernels", "buffers": {}, "probe_line_ms": None}

    def close(self) -> None:
        self.closed = True
