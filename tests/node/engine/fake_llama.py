"""A fake of node/engine/llama.py's LlamaModel and LlamaContext, for the scheduler alone.

This is a fake, not the model: it exists so that the scheduler layer (admission, followers,
hand-over, forks, bisection of failed decodes, draft verification) can be tested thread-free
and in milliseconds, without loading Gemma. Everything above the llama wrapper is real
(`Scheduler`, `KVBudget`, `Sequence`, the samplers, `verify`, the real `TokenBatch` it fills);
only the two classes the scheduler calls are replaced, with the methods it uses and nothing
more. Tests that need real logits or real KV use the Gemma fixture instead.

The fake keeps a KV per sequence id (position -> token) and checks what llama.cpp would
refuse: a decode whose positions do not continue a sequence's KV raises AssertionError, so a
scheduler bug shows as a failing test rather than as wrong text. Its "logits" are scripted:
the next token after a context is `next_token(context)` (by default the token after the last
one, in a cycle that skips BOS and EOS), overridden per (sequence id, position) by
`script`; a row is a one-hot-like vector, so greedy sampling picks exactly that token.
A decode fails (returns 1, with the KV untouched, as llama.cpp rolls a failed batch back)
whenever the batch holds one of the `poison` tokens.

The vocabulary is tiny: BOS (0), EOS (1) and the letters "a" to "z" as " a" ... " z" (2-27).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from node.engine.llama import TokenBatch
from node.engine.types import ModelInfo

BOS, EOS = 0, 1
LETTERS = "abcdefghijklmnopqrstuvwxyz"
N_VOCAB = 2 + len(LETTERS)


def letter(ch: str) -> int:
    """The token id of one letter."""
    return 2 + LETTERS.index(ch)


def after(context: Sequence[int]) -> int:
    """The default script: the letter after the context's last token, "z" wrapping to "a"."""
    last = context[-1] if context else BOS
    return 2 if last < 2 or last == N_VOCAB - 1 else last + 1


class FakeModel:
    """Shaped like LlamaModel: info, n_vocab, n_swa, tokenize, token_piece, detokenize."""

    def __init__(self, *, n_swa: int = 0) -> None:
        self.n_vocab = N_VOCAB
        self.n_swa = n_swa
        self.info = ModelInfo(name="fake", architecture="fake", n_vocab=N_VOCAB, n_ctx_train=4096, bos=BOS,
                              eos=EOS, eog_tokens=frozenset({EOS}), add_bos=True, chat_template=None)

    def tokenize(self, text: str | bytes, *, add_bos: bool = True, special: bool = True) -> list[int]:
        words = (text.decode() if isinstance(text, bytes) else text).split()
        return ([BOS] if add_bos else []) + [letter(w) for w in words]

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        if token == BOS:
            return b"<bos>" if special else b""
        if token == EOS:
            return b"<eos>" if special else b""
        return b" " + LETTERS[token - 2].encode()

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> bytes:
        return b"".join(self.token_piece(t, special=special) for t in tokens)


@dataclass(slots=True)
class Row:
    """One token of a decode as the fake saw it."""

    seq: int
    pos: int
    token: int
    logits: bool


@dataclass
class FakeContext:
    """Shaped like LlamaContext: decode, logits, seq_rm/cp/pos_max/pos_min, clear, state get/set."""

    model: FakeModel
    n_ctx: int = 256
    n_batch: int = 64
    n_seq_max: int = 4
    n_threads: int = 1
    next_token: Callable[[Sequence[int]], int] = after
    script: dict[tuple[int, int], int] = field(default_factory=dict)  # (seq id, position) -> next token
    poison: set[int] = field(default_factory=set)  # a batch holding one of these tokens fails
    decodes: list[list[Row]] = field(default_factory=list)  # every successful decode's rows
    failed: int = 0  # decodes that returned an error

    def __post_init__(self) -> None:
        self.n_vocab = self.model.n_vocab
        self.kv: dict[int, dict[int, int]] = {s: {} for s in range(self.n_seq_max)}
        self._rows = np.zeros((0, self.n_vocab), dtype=np.float32)

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = n_threads

    def decode(self, batch: TokenBatch) -> int:
        n = batch.n_tokens
        rows = [Row(int(batch.seq_ids[i]), int(batch.positions[i]), int(batch.tokens[i]), bool(batch.wants_logits[i]))
                for i in range(n)]
        if any(r.token in self.poison for r in rows):
            self.failed += 1
            return 1
        kv = {s: dict(cells) for s, cells in self.kv.items()}
        for r in rows:
            cells = kv[r.seq]
            expected = max(cells) + 1 if cells else 0
            assert r.pos == expected, f"sequence {r.seq}: token at position {r.pos}, its KV ends at {expected - 1}"
            cells[r.pos] = r.token
        out = []
        for r in rows:
            if r.logits:
                cells = kv[r.seq]
                context = [cells[p] for p in range(r.pos + 1)]
                token = self.script.get((r.seq, r.pos), self.next_token(context))
                row = np.zeros(self.n_vocab, dtype=np.float32)
                row[token] = 10.0
                out.append(row)
        self.kv = kv
        self._rows = np.array(out, dtype=np.float32).reshape(len(out), self.n_vocab)
        self.decodes.append(rows)
        return 0

    def logits(self, n_outputs: int) -> np.ndarray:
        assert n_outputs == len(self._rows), f"{n_outputs} logits rows asked, the decode made {len(self._rows)}"
        return self._rows

    # -- KV memory ------------------------------------------------------------------------

    def _seqs(self, seq: int) -> list[int]:
        return list(self.kv) if seq < 0 else [seq]

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 62
        for s in self._seqs(seq):
            self.kv[s] = {p: t for p, t in self.kv[s].items() if not lo <= p < hi}
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 62
        self.kv[dst].update({p: t for p, t in self.kv[src].items() if lo <= p < hi})

    def seq_pos_max(self, seq: int) -> int:
        return max(self.kv[seq], default=-1)

    def seq_pos_min(self, seq: int) -> int:
        return min(self.kv[seq], default=-1)

    def clear(self) -> None:
        for s in self.kv:
            self.kv[s] = {}

    # -- per-sequence state ---------------------------------------------------------------

    def state_get(self, seq: int) -> bytes:
        cells = self.kv[seq]
        return json.dumps([cells[p] for p in sorted(cells)]).encode()

    def state_copy(self, src: int, dst: int) -> bool:
        self.kv[dst] = dict(self.kv[src])
        return True

    def state_set(self, seq: int, state: bytes) -> bool:
        tokens = json.loads(state)
        self.kv[seq] = dict(enumerate(tokens))
        return True

    # -- what tests read ------------------------------------------------------------------

    def tokens_of(self, seq: int) -> list[int]:
        """The tokens seq's KV holds, in position order."""
        return [self.kv[seq][p] for p in sorted(self.kv[seq])]

    def decoded(self, token: int) -> int:
        """How many times a token went through a successful decode (any sequence)."""
        return sum(1 for rows in self.decodes for r in rows if r.token == token)
