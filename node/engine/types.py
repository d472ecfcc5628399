"""The engine's contract with the rest of the node: what a request is and what comes back.

Everything the serving layer, the CLI, the prefix cache and the Conclave need from the
engine goes through these types (and node/engine/config.py), so each of them can be read
without reading the scheduler, and none of them loads llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Literal, Mapping, Protocol

FinishReason = Literal["stop", "length", "cancelled", "error"]
# The finish reasons of a generation that ran to its end (an end token, a stop string or
# max_tokens): its answer is complete, worth remembering and its final state worth storing.
COMPLETED: tuple[FinishReason, ...] = ("stop", "length")
GrammarKind = Literal["gbnf", "lark", "json_schema", "regex"]


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A constraint on the output: its language and its text (node/engine/grammar.py compiles it).

    `gbnf`: llama.cpp's grammar syntax; `lark`: llguidance's Lark dialect; `json_schema`: a JSON
    Schema as canonical JSON text (sorted keys, so equal schemas share one compiled grammar and
    one L1 key); `regex`: the whole output matches it.
    """

    kind: GrammarKind
    text: str

# Admission classes (GenerationRequest.priority): the scheduler admits and prefills the lowest
# number first, in arrival order within a class. Batch lines (node/batches) run as BATCH.
INTERACTIVE = 0
BATCH = 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Everything that shapes the choice of the next token (llama.cpp semantics)."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    grammar: GrammarSpec | None = None  # the output must match it

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One sequence to generate: already tokenized (template applied by the caller)."""

    prompt_tokens: tuple[int, ...]
    max_tokens: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: off; k >= 0: chosen token's logprob plus top k
    request_id: str = ""
    # On a finish by "stop" or "length", hand the prefix cache the state of prompt + answer
    # (up to its last block boundary whose KV is complete) before the slot is freed, so a
    # prompt that continues this conversation restores the answer instead of prefilling it.
    store_final_state: bool = False
    # Draft tokens may be verified for this request (output is the same either way; False
    # gives plain decoding, the baseline benchmarks compare against).
    speculation: bool = True
    # INTERACTIVE (live requests) or BATCH (batch lines): interactive work is admitted first, and
    # batch work leaves `EngineConfig.interactive_slots` slots to it (node/engine/scheduler.py).
    priority: int = INTERACTIVE
    # Longest wait in the queue for a slot and KV cells, in seconds (0: as long as it takes);
    # past it the request ends unstarted with `Finished.retry_after_s` set (a 503 to clients).
    max_wait_s: float = 0.0
    # The tenant whose prefix states the request may restore and store (node/serving/tenants.py;
    # "": the open tenant of a node without keys); identical prompts of two tenants share no prefill.
    cache_scope: str = ""
    # One of a group whose vote may end it before every member finished (a Conclave's candidates):
    # the batch is then not bound by its slowest member, and the planner values every kept token
    # of it as a plain token's (node/speculative/draining.py).
    voted: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    text: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text ready for the client: whole UTF-8 characters, stop strings held back."""

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every handle."""

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    generated: tuple[int, ...]  # every generated token id (stop-string tokens included)
    error: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)  # ttft_s, prefill_s, decode_s
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache instead of computed
    stop_sequence: str | None = None  # the stop string that ended the text (reason "stop")
    retry_after_s: int = 0  # > 0: never started, the wait for room passed `max_wait_s`; retry after this
    steps: int = 0  # decode steps that verified rows for it: tokens after the first, less what drafts and jumps saved


Event = TextDelta | Finished


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the rest of the node needs to know about the loaded model."""

    name: str
    architecture: str
    n_vocab: int
    n_ctx_train: int
    bos: int | None
    eos: int | None
    eog_tokens: frozenset[int]
    add_bos: bool
    chat_template: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EmbeddingInfo:
    """How the engine embeds (node/engine/embedder.py)."""

    n_embd: int
    pooling: str         # "mean" | "cls" | "last" | "rank" (a reranker: no embeddings)
    pooling_source: str  # "model" (the GGUF declares it) | "default" (mean pooling: the GGUF has none)
    max_tokens: int      # tokens one input may hold


class GenerationHandle(Protocol):
    """The caller's side of one submitted generation: its events, and a way to stop it.

    `group` is shared by the generations of one `submit_n` / `submit_group` call; passing it
    to a later `submit_group` makes the new ones forks of the same prompt.
    """

    group: int

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[Event]: ...
