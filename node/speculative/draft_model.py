"""The `model` draft source: a smaller model of the same vocabulary drafts the next tokens.

It has its own llama.cpp context with one KV sequence per engine slot. A proposal brings the
draft model's KV level with the sequence's context (the common prefix with what it holds
stays, the rest is removed with llama_memory_seq_rm and the missing tokens are decoded:
a rollback after rejected drafts costs nothing but the re-decode of the tokens kept), then
drafts k tokens one decode at a time: greedy for a greedy sequence (a deterministic draft,
checked by the target's argmax), drawn from the sequence's own sampling settings for a
sampled one. An unseeded sampled sequence's draft is drawn with random numbers of its own and
carries the distribution of each token, so the engine verifies it by rejection sampling
(node/engine/verify.py) and the output stays the target's distribution. A seeded one's is
drawn with the very Gumbel noise the target's own draw uses at each position (the request's
seed, `TokenSampler.coupled_draw`) and carries no distribution: it is verified like any
deterministic draft, kept where the target's seeded draw picks the same token, so the text
is plain decoding's with that seed whatever was drafted (rejection sampling's random numbers
are not plain decoding's: its text would follow the draft lengths the controller chose). The
two draws share their noise, so they agree wherever the two distributions are close (Gumbel
coupling: nearly as often as rejection sampling keeps a token).

Making a draft costs engine-thread time (one draft-model decode per token), unlike an index
lookup: `cost_per_token` (a moving average of what proposals took) lets the controller
weigh it, and the controller asks for no more tokens than it expects to verify.

Vocabulary: the draft model must tokenize exactly like the target. `check_vocabularies`
refuses at start, with the first difference, anything but a few padding entries at the
end (llama.cpp's own limit for speculative pairs is of that kind): same tokenizer kind,
same BOS/EOS, the same piece for every shared id.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from node.engine.errors import ModelLoadError
from node.engine.hooks import Draft, DraftSeq
from node.engine.llama import LlamaContext, LlamaModel, TokenBatch
from node.engine.sampling import TokenSampler

log = logging.getLogger(__name__)

PADDING_MAX = 128       # extra ids one vocabulary may have at its end
COST_EMA = 0.2
BATCH = 512
DRAFT_SALT = 0x5EED_D0AF  # an unseeded request's draft draws use a seed of their own, derived from its sequence's


class VocabularyMismatch(ModelLoadError):
    """The draft model does not tokenize like the target."""


def check_vocabularies(target: LlamaModel, draft: LlamaModel) -> None:
    """Raise VocabularyMismatch saying what differs; padding at the end is allowed."""
    kind_t = target.info.metadata.get("tokenizer.ggml.model")
    kind_d = draft.info.metadata.get("tokenizer.ggml.model")
    if kind_t != kind_d:
        raise VocabularyMismatch(f"draft model tokenizer {kind_d!r} is not the target's {kind_t!r}")
    if (target.info.bos, target.info.eos) != (draft.info.bos, draft.info.eos):
        raise VocabularyMismatch(f"draft model BOS/EOS {draft.info.bos}/{draft.info.eos} differ from the "
                                 f"target's {target.info.bos}/{target.info.eos}")
    if abs(target.n_vocab - draft.n_vocab) > PADDING_MAX:
        raise VocabularyMismatch(f"draft model vocabulary has {draft.n_vocab} tokens, the target {target.n_vocab} "
                                 f"(at most {PADDING_MAX} of padding may differ)")
    for token in range(min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_piece(token), draft.token_piece(token)
        if a != b:
            raise VocabularyMismatch(f"draft model token {token} is {b!r}, the target's {a!r}")


@dataclass(slots=True)
class _DraftState:
    slot: int
    sampler: TokenSampler | None                   # None: greedy
    coupled: bool = False                          # drawn with the target's own noise (a seeded request)
    tokens: list[int] = field(default_factory=list)  # what the draft KV holds, in order


class DraftModel:
    """Implements node.speculative.source.DraftSource with a draft GGUF."""

    name = "model"

    def __init__(self, path: Path, *, target_path: Path, n_ctx: int, n_parallel: int, n_threads: int) -> None:
        target = LlamaModel(target_path, vocab_only=True)
        try:
            self._model = LlamaModel(path)
        except Exception:
            target.close()
            raise
        try:
            check_vocabularies(target, self._model)
        except Exception:
            self._model.close()
            raise
        finally:
            target.close()
        self._ctx = LlamaContext(self._model, n_ctx=n_ctx, n_batch=BATCH, n_ubatch=BATCH, n_seq_max=n_parallel,
                                 n_threads=n_threads)
        self._batch = TokenBatch(BATCH)
        self._per_seq = n_ctx // n_parallel
        self._free = list(range(n_parallel))
        self._seqs: dict[int, _DraftState] = {}
        self.cost_per_token = 0.0
        self.path = Path(path)
        log.info("draft model %s: %d tokens of vocabulary, %d KV cells per sequence", self.path.name,
                 self._model.n_vocab, self._per_seq)

    def begin(self, seq: DraftSeq) -> None:
        if not self._free:
            return
        sampler, coupled = None, False
        if seq.sampled and seq.sampling is not None:
            coupled = seq.sampling.seed is not None and seq.seed is not None
            own = seq.seed if seq.seed is not None else seq.key
            seed = own if coupled else (own * 0x9E3779B1 + DRAFT_SALT) & (2**63 - 1)
            sampler = TokenSampler(seq.sampling, self._model.n_vocab, seed=seed)
        self._seqs[seq.key] = _DraftState(self._free.pop(), sampler, coupled)

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        state = self._seqs.get(seq.key)
        if state is None or k <= 0 or len(context) + k > self._per_seq:
            return None
        t0 = time.perf_counter()
        row = self._catch_up(state, context)
        if row is None:
            return None
        out: list[int] = []
        dists: list[tuple[np.ndarray, np.ndarray]] = []
        history = list(context)
        for i in range(k):
            if state.sampler is None:
                token = int(np.argmax(row))
            elif state.coupled:
                token = state.sampler.coupled_draw(row, history)
            else:
                dist = state.sampler.draft_distribution(row, history)
                token = state.sampler.draw_from(dist, len(history))
                dists.append(dist)
            out.append(token)
            history.append(token)
            if i + 1 < k:
                next_row = self._decode([token], len(state.tokens), state.slot)
                if next_row is None:
                    break
                state.tokens.append(token)
                row = next_row
        elapsed = time.perf_counter() - t0
        self.cost_per_token += COST_EMA * (elapsed / len(out) - self.cost_per_token)
        return Draft(tuple(out), self.name, tuple(dists[:len(out)]) if dists else None)

    def _catch_up(self, state: _DraftState, context: Sequence[int]) -> np.ndarray | None:
        """Bring the draft KV level with context; the logits row after its last token."""
        common = 0
        limit = min(len(state.tokens), len(context) - 1)  # the last token is always decoded: its row
        held = state.tokens
        while common < limit and held[common] == context[common]:
            common += 1
        if common < len(held):
            self._ctx.seq_rm(state.slot, common, -1)
            del held[common:]
        row: np.ndarray | None = None
        while len(held) < len(context):
            chunk = list(context[len(held):len(held) + BATCH])
            row = self._decode(chunk, len(held), state.slot)
            if row is None:
                return None
            held.extend(chunk)
        return row

    def _decode(self, tokens: list[int], start: int, slot: int) -> np.ndarray | None:
        self._batch.clear()
        self._batch.add(tokens, start, slot, logits="last")
        if self._ctx.decode(self._batch) != 0:
            log.warning("draft model decode failed at position %d; this sequence is not drafted", start)
            self._ctx.seq_rm(slot)
            for state in self._seqs.values():
                if state.slot == slot:
                    state.tokens.clear()
            return None
        return self._ctx.logits(1)[0].copy()

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        state = self._seqs.pop(seq.key, None)
        if state is not None:
            self._ctx.seq_rm(state.slot)
            self._free.append(state.slot)

    def close(self) -> None:
        self._ctx.close()
        self._model.close()
