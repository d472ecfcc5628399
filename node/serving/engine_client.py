"""What the serving layer needs from an engine: the Protocol the service, the app and warm-ahead call.

`node.engine.engine.Engine` implements it; so does the fake engine of the tests
(tests/node/fake_engine.py), which is how the service, sessions, L1 and the HTTP layer are
tested without loading a model. Only the engine's contract types are imported here
(node/engine/types.py, node/engine/config.py), never llama.cpp.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from node.engine.config import EngineConfig
from node.engine.types import EmbeddingInfo, GenerationHandle, GenerationRequest, ModelInfo


class EngineClient(Protocol):
    @property
    def config(self) -> EngineConfig:
        """What the engine was started with (model path, KV type, its prefix cache)."""

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def n_ctx(self) -> int: ...

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> bytes: ...

    def token_piece(self, token: int) -> bytes: ...

    def submit(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> GenerationHandle:
        """One generation; raises the engine's typed errors for what can never run."""

    def submit_n(self, req: GenerationRequest, n: int,
                 loop: asyncio.AbstractEventLoop | None = None) -> Sequence[GenerationHandle]:
        """n generations of one prompt sharing one prefill (choice i seeded seed + i)."""

    def submit_group(self, reqs: Sequence[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None, *,
                     spare: int = 0, group: int | None = None) -> Sequence[GenerationHandle]:
        """Generations of one prompt with parameters of their own sharing one prefill; `spare`
        reserves KV for that many more joining later with `group` (the Conclave)."""

    @property
    def embedding_info(self) -> EmbeddingInfo:
        """Width, pooling and the most tokens of one input of the engine's embeddings."""

    def embed(self, inputs: Sequence[Sequence[int]]) -> concurrent.futures.Future[np.ndarray]:
        """Pooled (not normalised) vectors of token-id inputs, one row each, batched by the engine."""

    def stats(self) -> Mapping[str, int | float]: ...

    def kernel_report(self) -> Mapping[str, Any]:
        """The CPU kernels the engine runs and why (node/engine/kernels.py's report)."""

    def close(self) -> None: ...
