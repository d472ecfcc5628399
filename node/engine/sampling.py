"""Choosing the next token from one row of logits, in numpy, with llama.cpp's semantics.

One `TokenSampler` per request, with its seed; the random numbers it uses at a position are
hashes of (seed, position, purpose) (`uniform`, and `gumbel` per token id for the draw), so a
seeded sequence draws the same token at the same position however its drafts went. A draw is
the best of the candidates' tempered logits plus their own Gumbel noise (the Gumbel-max trick:
exactly the tempered distribution), which moves only where two scores lie closer than the row
moved: a verify row of another shape leaves it as it was. The row is a float32 view straight
into llama.cpp's logits buffer. Bias and penalties touch a few ids of it: they are applied in
place and those ids put back as they were when the choice is made (`_adjusting`), so forked
sequences that sample from the same row each see it untouched. A copy of the whole row (1 MiB
at Gemma's vocabulary) cost about 37 us a token more than touching a few ids: four users'
steps spent 0.74 ms outside llama_decode with it, 0.59 ms without (the first read of the row,
the argmax's now, still pays most of the memory traffic the copy paid).

Order, as in llama.cpp's default chain: logit_bias -> penalties -> top_k -> top_p ->
min_p -> temperature -> draw. top_p and min_p judge the untempered distribution
(temperature only reshapes what survives), exactly like llama.cpp.

Penalties (llama.cpp semantics) look at the last `repeat_last_n` tokens of the whole
sequence, prompt included (-1: the whole sequence, 0: off): for every distinct token
there, a positive logit is divided by `repeat_penalty` and a negative one multiplied,
then `count * frequency_penalty + presence_penalty` is subtracted.

Cost at Gemma's 262,144-token vocabulary (see bench/sampling.py): greedy is one argmax;
top_k finds its k tokens from a lower bound on the k-th largest logit (maxima of 64-token
groups), so only a few hundred logits are partially sorted; top_p without top_k grows a
pool from the best 256 until it holds the requested mass. All of it is exact: no token
that llama.cpp's chain could draw is left out.

Reported logprobs are those of the adjusted distribution (after bias and penalties,
before temperature and truncation), over the whole vocabulary (under a grammar: over the
tokens it allows).

Under a grammar (a `Constraint`, node/engine/grammar.py), as llama.cpp's common sampler does:
the token is chosen from the unconstrained row first and checked against the grammar (a few
microseconds); only when the grammar rejects it is the whole-vocabulary mask computed and
the choice made again from the masked row (the same chain, a second draw). Greedy is
therefore exactly the argmax over the allowed tokens; sampling draws from the allowed tokens
by the same chain. Asking for logprobs never changes the choice: the reported numbers are
those of the masked row. Rejection sampling of a draft model's tokens (`choose_against`)
targets exactly this two-stage distribution (`target`), so a sampled constrained sequence
draws from one distribution with or without a draft model.

Where the grammar forces the next bytes, the choice is their first canonical token
(llguidance's forced tokens, which its mask holds alone there), whatever the row says: the
check alone would admit any token that spells them (`":` then `"` for `":"`), a tokenization
the tokenizer never produces, and the choice would then hang on the logits. Taken from the
grammar, a forced token is known before its row is computed, so the engine appends it without
asking for logits (jump-forward, node/engine/scheduler.py) and the output is the same as
decoding it from its row. Elsewhere the check and the mask can still disagree (a token the
check admits that the mask leaves out keeps its logit in the masked row: rejection sampling of
drafts and logprobs see it too).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np

from node.engine.errors import InvalidRequest
from node.engine.types import SamplingParams

BLOCK = 64           # block size for the top-k lower bound (see top_ids)
INITIAL_POOL = 256   # first pool size for top_p without top_k


@dataclass(frozen=True, slots=True)
class Choice:
    """The chosen token and, when asked for, its logprob and the top alternatives."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class Constraint(Protocol):
    """Which tokens may come next (a grammar's parse state); see node/engine/grammar.py."""

    def allows(self, token: int) -> bool: ...

    def masked(self, logits: np.ndarray) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...

    def forced(self) -> Sequence[int]: ...

    def only(self) -> int | None: ...

    def valid(self, tokens: Sequence[int]) -> int: ...


def validate_params(params: SamplingParams, n_vocab: int) -> None:
    """Raise InvalidRequest for values llama.cpp would reject or misbehave on."""
    if not np.isfinite(params.temperature) or params.temperature < 0:
        raise InvalidRequest(f"temperature must be >= 0, got {params.temperature}")
    if params.top_k < 0:
        raise InvalidRequest(f"top_k must be >= 0, got {params.top_k}")
    if params.seed is not None and params.seed < 0:
        raise InvalidRequest(f"seed must be >= 0, got {params.seed}")
    if not 0.0 < params.top_p <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0.0 <= params.min_p <= 1.0:
        raise InvalidRequest(f"min_p must be in [0, 1], got {params.min_p}")
    if not params.repeat_penalty > 0:
        raise InvalidRequest(f"repeat_penalty must be > 0, got {params.repeat_penalty}")
    if params.repeat_last_n < -1:
        raise InvalidRequest(f"repeat_last_n must be >= -1, got {params.repeat_last_n}")
    for token, bias in params.logit_bias.items():
        if not isinstance(token, (int, np.integer)) or not 0 <= token < n_vocab:
            raise InvalidRequest(f"logit_bias token {token!r} is not in the vocabulary (0..{n_vocab - 1})")
        if np.isnan(bias) or bias == np.inf:
            raise InvalidRequest(f"logit_bias for token {token} must be a number or -inf")


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


class TokenSampler:
    """Per-request sampler: adjustments, truncation, temperature and its own RNG."""

    __slots__ = ("params", "seed", "n_logprobs", "constraint", "_bias_ids", "_bias_values", "_penalised")

    def __init__(self, params: SamplingParams, n_vocab: int, *, logprobs: int | None = None,
                 seed: int | None = None, constraint: Constraint | None = None) -> None:
        validate_params(params, n_vocab)
        self.params = params
        self.seed = seed if seed is not None else (params.seed if params.seed is not None else fresh_seed())
        self.n_logprobs = logprobs
        self.constraint = constraint
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        self._bias_values = np.fromiter(params.logit_bias.values(), dtype=np.float32,
                                        count=len(params.logit_bias))
        self._penalised = params.repeat_last_n != 0 and (
            params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        )

    def uniform(self, position: int, purpose: int) -> float:
        """The random number in [0, 1) this sequence uses at `position` for `purpose`."""
        return uniform(self.seed, position, purpose)

    def choose(self, row: np.ndarray, history: Sequence[int], draft: int | None = None) -> Choice:
        """Pick the next token from one logits row; `history` is the sequence so far. `draft`: a
        deterministic draft's token for this position, which a greedy choice keeps at a near-tie
        (its adjusted logit within DRAFT_TIE_NATS of the best, and the grammar admitting it)."""
        with self._adjusting(row, history) as logits:
            return self._choose(logits, len(history), draft)

    def _choose(self, logits: np.ndarray, position: int, draft: int | None) -> Choice:
        constraint = self.constraint
        forced = _first_forced(constraint)
        token = forced if forced is not None else self._pick(logits, position, DRAW)
        if (draft is not None and draft != token and forced is None and 0 <= draft < len(logits)
                and self._near_draft(logits, token, draft, position)
                and (constraint is None or constraint.allows(draft))):
            token = draft
        if constraint is not None:
            if forced is not None or constraint.allows(token):
                if self.n_logprobs is not None:
                    logits = _masked_keeping(constraint, logits, token)
            else:
                logits = constraint.masked(logits)
                token = self._pick(logits, position, REDRAW)
            constraint.accept(token)
        if self.n_logprobs is None:
            return Choice(token)
        return _with_logprobs(logits, token, self.n_logprobs)

    def _near_draft(self, logits: np.ndarray, token: int, draft: int, position: int) -> bool:
        """Whether a deterministic draft's token, not chosen, was within DRAFT_TIE_NATS of it.

        Greedy: its logit that close to the best's. A seeded draw: the draw with the draft
        token's logit raised by DRAFT_TIE_NATS would have picked it, truncation included. A
        token on the edge of top_p or min_p is in or out as the row moves a little; most of a
        replay's partings were there (the draft cut, or a token just let in drawing best). The
        raise holds the draft in where it sat inside the edge before, and a rival that passes
        the truncation by less than DRAFT_TIE_NATS (cut with its logit lowered by that much)
        does not displace it. An unseeded draw never keeps it: its distribution stays exactly
        the target's."""
        if self.params.greedy:
            return bool(logits[draft] >= logits[token] - DRAFT_TIE_NATS)
        if self.params.seed is None:
            return False
        raised = logits.copy()
        raised[draft] += DRAFT_TIE_NATS
        for _ in range(EDGE_RIVALS + 1):
            rival = self._draw(raised, position, DRAW)
            if rival == draft:
                return True
            raised[rival] -= DRAFT_TIE_NATS
            if np.any(self._truncated(raised)[0] == rival):
                return False
            raised[rival] = -np.inf  # an edge token: set aside
        return False

    def _pick(self, logits: np.ndarray, position: int, purpose: int) -> int:
        return int(np.argmax(logits)) if self.params.greedy else self._draw(logits, position, purpose)

    @contextlib.contextmanager
    def _adjusting(self, row: np.ndarray, history: Sequence[int]) -> Iterator[np.ndarray]:
        """The row with logit_bias and the penalties applied, for the body of the `with`: in
        place, the ids they touch put back as they were on leaving, whatever happens inside
        (a row that cannot be written, such as a test's, is copied instead)."""
        penalised = self._penalised and len(history) > 0
        if not self._bias_ids.size and not penalised:
            yield row
            return
        window: Sequence[int] = ()
        if penalised:
            last_n = self.params.repeat_last_n
            window = history if last_n < 0 else history[-last_n:]
        writable = row.flags.writeable
        logits = row if writable else row.copy()
        touched = np.concatenate((self._bias_ids, np.asarray(window, dtype=np.int64)))
        saved = logits[touched]  # a copy (duplicates hold the same value twice: harmless)
        try:
            if self._bias_ids.size:
                np.add.at(logits, self._bias_ids, self._bias_values)
            if penalised:
                apply_penalties(logits, window, self.params)
            yield logits
        finally:
            if writable:
                row[touched] = saved

    def choose_against(self, row: np.ndarray, history: Sequence[int], token: int,
                       draft: tuple[np.ndarray, np.ndarray]) -> tuple[Choice, bool]:
        """Rejection sampling of a draft `token` drawn from `draft` = (ids, probabilities):
        kept with probability min(1, p(token) / q(token)), otherwise a token drawn from the
        residual max(0, p - q) renormalised, where p is exactly the distribution `choose` draws
        from (`target`). The result is distributed as `choose`'s draw (speculative sampling);
        returns (the choice, whether it is the draft token). Where p would cost too much to
        write down (`target` is None), the plain draw decides and the draft is kept when it
        drew the same token: still exact, only fewer drafts kept."""
        with self._adjusting(row, history) as logits:
            target = None if self.params.greedy else self.target(logits)
            if target is not None:
                return self._against(logits, len(history), token, draft, target)
        choice = self.choose(row, history)
        return choice, choice.token == token

    def _against(self, logits: np.ndarray, position: int, token: int, draft: tuple[np.ndarray, np.ndarray],
                 target: tuple[np.ndarray, np.ndarray]) -> tuple[Choice, bool]:
        ids, p = target
        q = _aligned(draft, ids)
        where = np.flatnonzero(ids == token)
        p_token = float(p[where[0]]) if where.size else 0.0
        q_ids, q_probs = draft
        q_token = float(q[where[0]]) if where.size else float(q_probs[q_ids == token].sum())
        if accept_draft(self.uniform(position, ACCEPT), p_token, q_token):
            chosen, kept = token, True
        else:
            chosen, kept = _draw_from(ids, residual(p, q), self.uniform(position, RESIDUAL)), False
        constraint = self.constraint
        if constraint is not None:
            if self.n_logprobs is not None:
                logits = (_masked_keeping(constraint, logits, chosen) if constraint.allows(chosen)
                          else constraint.masked(logits))
            constraint.accept(chosen)
        if self.n_logprobs is None:
            return Choice(chosen), kept
        return _with_logprobs(logits, chosen, self.n_logprobs), kept

    def target(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, probabilities) of `choose`'s draw from these adjusted logits, every id outside
        having probability 0; None when a grammar would have to check more than CHECK_LIMIT
        tokens to say it.

        Without a grammar that is the truncated, tempered row. With one, `choose` draws from the
        unconstrained row first and, when the grammar's check rejects the token, again from the
        masked row, so p(t) = p_row(t) * allowed(t) + rejected * p_masked(t), rejected being the
        row's mass the check refuses. Tokens the mask admits are allowed; the check is asked only
        about the others in the row's support."""
        constraint = self.constraint
        forced = _first_forced(constraint)
        if forced is not None:  # `choose` takes it whatever the row
            return np.array([forced], dtype=np.int64), np.ones(1)
        ids, weights = self._weights(logits)
        p_row = weights / weights.sum()
        if constraint is None:
            return ids, p_row
        masked = constraint.masked(logits)
        allowed = np.isfinite(masked[ids])
        unknown = np.flatnonzero(~allowed)
        if len(unknown) > CHECK_LIMIT:
            return None
        for i in unknown:
            allowed[i] = constraint.allows(int(ids[i]))
        rejected = float(p_row[~allowed].sum())
        if rejected <= 0.0:
            return ids, p_row
        masked_ids, masked_weights = self._weights(masked)
        all_ids = np.concatenate([ids, masked_ids])
        mass = np.concatenate([np.where(allowed, p_row, 0.0), rejected * masked_weights / masked_weights.sum()])
        merged, inverse = np.unique(all_ids, return_inverse=True)
        p = np.zeros(len(merged))
        np.add.at(p, inverse, mass)
        keep = p > 0
        return merged[keep], p[keep]

    def _weights(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids a draw can pick, in increasing id order, and their tempered weights."""
        ids, values = self._truncated(logits)
        return ids, np.exp(self._tempered(values))

    def _truncated(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids a draw can pick (top_k, top_p, min_p applied), in increasing id order, and
        their logits (the truncation needs them best first; the order they are returned in does
        not depend on near-ties, so a residual draw walks them the same way whatever the row's
        last bits)."""
        p = self.params
        ids, probs = candidates(logits, p.top_k, p.top_p, p.min_p)
        keep = len(ids)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0]))))
        kept = ids[:keep]
        if keep < len(logits):  # the whole vocabulary comes in id order already
            kept = np.sort(kept)
        return kept, logits[kept].astype(np.float64)

    def _tempered(self, values: np.ndarray) -> np.ndarray:
        """Logits over temperature, the best at 0."""
        return (values - values.max()) / self.params.temperature

    def _draw(self, logits: np.ndarray, position: int, purpose: int) -> int:
        ids, scores = self._scores(logits, position, purpose)
        return int(ids[np.argmax(scores)])

    def _scores(self, logits: np.ndarray, position: int, purpose: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids a draw can pick and their scores: tempered logit plus the id's own Gumbel
        noise at this position (`gumbel`). The best score is a draw from the tempered,
        truncated distribution (the Gumbel-max trick).

        A draw from the cumulative weights would move whenever the shares of the tokens before
        it move: a verify row computed in a step of another shape moves many shares by 0.1-0.2
        nats at once (docs/BENCHMARKS.md), and the stretches of the cumulative sum add those
        moves up. The best score moves only by what its own logit and its nearest rival's move,
        so a seeded request replayed with speculation on draws what it drew before (and keeps
        its stored answer as a draft) unless two scores lie that close: a near-tie, as greedy
        decoding has."""
        ids, values = self._truncated(logits)
        return ids, self._tempered(values) + gumbel(self.seed, position, purpose, ids)

    def draft_distribution(self, row: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) a draft model's token is drawn from: these sampling settings
        (bias, penalties, truncation, temperature) over the draft model's logits row."""
        with self._adjusting(row, history) as logits:
            ids, weights = self._weights(logits)
        return ids, weights / weights.sum()

    def coupled_draw(self, row: np.ndarray, history: Sequence[int]) -> int:
        """The token this sampler's own draw picks from `row` (a draft model's logits) at the
        position after `history`: the same Gumbel noise as `choose` uses there, so a draft drawn
        this way and the target's draw agree wherever their distributions are close."""
        with self._adjusting(row, history) as logits:
            return self._pick(logits, len(history), DRAW)

    def draw_from(self, dist: tuple[np.ndarray, np.ndarray], position: int) -> int:
        """A draft token for `position` from `dist` (a draft model's distribution)."""
        return _draw_from(dist[0], dist[1], self.uniform(position, DRAFT))


# What the random number of a position is for: each purpose has its own, so a draft model's
# draw, the target's acceptance test and its residual draw are independent of each other.
DRAW, REDRAW, ACCEPT, RESIDUAL, DRAFT = range(5)
# A greedy choice keeps a deterministic draft's token when its logit is within this many nats of
# the row's best, and a seeded draw when raising its logit by this much would have drawn it
# (`TokenSampler.choose`'s `draft`): a verify step's rows are not bit-identical to
# one-token steps (bench/batch_invariance.py: the top-2 gap moves by up to 0.17-0.26 nats), so
# without it a repeated request leaves its stored answer at the first near-tie the batch shape
# flips, and every draft after that is rejected. Greedy text then differs from plain decoding
# only where the verify row's top-2 gap is under DRAFT_TIE_NATS, i.e. where plain decoding's is
# under DRAFT_TIE_NATS plus the kernels' move, inside the bound the tests hold greedy text to
# (tests/node/near_ties.py, 0.4 nats): 0.13 + 0.26 < 0.4. The widest margin that bound allows:
# two verify rows of different shapes can each move a gap, so a stored answer drafted again may
# meet its near-tie moved twice (on an AMD EPYC with repacked weights, the 4 users' free request
# left its stored answer in 5 of 16 repeated rounds at 0.1 nats, 1 of 10 at 0.13, 0 of 13 at
# 0.15 and above; docs/BENCHMARKS.md).
DRAFT_TIE_NATS = 0.13
# Rivals on the truncation's edge a seeded draw sets aside before it gives up a draft's token.
EDGE_RIVALS = 2
CHECK_LIMIT = 1024  # grammar checks one rejection-sampling step may make (see TokenSampler.target)


def uniform(seed: int, position: int, purpose: int) -> float:
    """A random number in [0, 1) that depends only on (seed, position, purpose).

    Keyed by position rather than drawn from a running generator, a seeded sequence uses the
    same number at the same position whatever happened before: however many drafts were
    verified, kept or rejected, a seeded request draws the same text (up to the kernels'
    near-ties), with speculation on or off. NumPy's SeedSequence hashes the key."""
    words = np.random.SeedSequence([seed & (2**64 - 1), position, purpose]).generate_state(2, np.uint32)
    return ((int(words[0]) << 21) ^ (int(words[1]) >> 11)) / float(1 << 53)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def gumbel(seed: int, position: int, purpose: int, ids: np.ndarray) -> np.ndarray:
    """Gumbel noise for each of `ids`, depending only on (seed, position, purpose, id): the
    position's key (as `uniform`'s, from NumPy's SeedSequence) starts a SplitMix64 stream, an
    id's number is the stream's element at that id, and -log(-log(u)) makes it Gumbel."""
    key = np.random.SeedSequence([seed & (2**64 - 1), position, purpose]).generate_state(1, np.uint64)[0]
    with np.errstate(over="ignore"):
        x = np.asarray(ids).astype(np.uint64) * _GOLDEN + key
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    u = ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return -np.log(-np.log(u))


def accept_draft(u: float, p: float, q: float) -> bool:
    """Keep a draft token drawn with probability q that the target gives p: with probability
    min(1, p / q), decided by the uniform number u."""
    return q > 0.0 and u * q < p


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """What a rejected draft's replacement is drawn from: max(0, p - q) (unnormalised; p itself
    when nothing is left, which happens only where rejection cannot)."""
    rest = np.maximum(p - q, 0.0)
    return rest if rest.sum() > 0 else p


def _draw_from(ids: np.ndarray, weights: np.ndarray, u: float) -> int:
    cumulative = np.cumsum(weights)
    pick = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return int(ids[min(pick, len(ids) - 1)])


def _aligned(dist: tuple[np.ndarray, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """The probabilities of `dist` at `ids` (0 where it has none)."""
    q_ids, q_probs = dist
    if not len(q_ids):
        return np.zeros(len(ids))
    order = np.argsort(q_ids)
    sorted_ids = q_ids[order]
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[at] == ids, q_probs[order][at], 0.0)


def apply_penalties(logits: np.ndarray, window: Sequence[int], params: SamplingParams) -> None:
    """llama.cpp's repeat/frequency/presence penalties, in place, over the tokens in window."""
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    values = logits[ids]
    if params.repeat_penalty != 1.0:
        values = np.where(values <= 0, values * params.repeat_penalty, values / params.repeat_penalty)
    values = values - (counts * params.frequency_penalty + params.presence_penalty)
    logits[ids] = values


def top_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, best first, without sorting the whole vocabulary.

    The vocabulary is cut into groups of BLOCK tokens that lie `n / BLOCK` apart (the columns
    of the row seen as BLOCK x n/BLOCK): the k-th largest of the groups' maxima is a lower
    bound for the k-th largest logit (k groups each hold one value at least that high), and
    only the groups whose maximum reaches it can hold one of the k. The maxima are element-wise
    maxima over BLOCK contiguous rows (`group_maxima`; a reduction along a short inner axis
    would cost twenty times more: it was most of a sampled token's time at Gemma's vocabulary),
    and only the few groups that reach the bound are read again before the partial sort.
    """
    n = len(logits)
    if k >= n:
        ids = np.arange(n)
    elif n % BLOCK or k * BLOCK * 4 > n:
        ids = np.argpartition(logits, n - k)[n - k:]
    else:
        width = n // BLOCK
        view = logits.reshape(BLOCK, width)
        maxima = group_maxima(view)
        floor = np.partition(maxima, width - k)[width - k]
        columns = np.flatnonzero(maxima >= floor)
        member, column = np.nonzero(view[:, columns] >= floor)
        ids = member * width + columns[column]  # ascending: member-major, columns ascending
        if len(ids) > k:
            ids = ids[np.argpartition(logits[ids], len(ids) - k)[len(ids) - k:]]
    return ids[np.argsort(-logits[ids], kind="stable")]


def group_maxima(view: np.ndarray) -> np.ndarray:
    """The maximum of each column of `view` (rows: a power of two), by halving: the two halves
    of the row block compared element-wise, then the halves of that, down to one row.

    The same numbers as `np.maximum.reduce(view, axis=0)` (a maximum is exact in any order),
    read faster from a row that is not in cache, as every fresh row of logits is: the first
    halving streams both halves of the row once, and the rest works on a quarter of it, in
    cache. On an AMD EPYC (Zen 5), logits rows of a Conclave's steps read from memory: 55 us a
    row against 79 us for the reduction, whose loop walks the columns of its 64 rows in turn
    (bench/sampling.py)."""
    half = len(view) // 2
    if half == 0 or len(view) & (len(view) - 1):
        return np.maximum.reduce(view, axis=0)
    out = np.maximum(view[:half], view[half:])
    while half > 1:
        half //= 2
        np.maximum(out[:half], out[half:2 * half], out=out[:half])
    return out[0]


def candidates(logits: np.ndarray, top_k: int, top_p: float, min_p: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids that can survive top_k (0 = off), top_p and min_p, and their untempered
    probabilities; best first whenever top_p or min_p will cut the list.

    With top_k the probabilities are normalised over the k survivors (as llama.cpp's top_p
    sees them). Without it they are normalised over the whole vocabulary, and the pool
    grows from the best 256 until it holds top_p of the mass (or is the whole vocabulary).
    """
    if top_k > 0:
        ids = top_ids(logits, top_k)
        probs = np.exp(logits[ids].astype(np.float64) - float(logits[ids[0]]))
        return ids, probs / probs.sum()
    best = float(logits.max())
    if top_p >= 1.0:
        if min_p > 0.0:
            ids = np.flatnonzero(logits >= best + np.log(min_p))
            ids = ids[np.argsort(-logits[ids], kind="stable")]
        else:
            ids = np.arange(len(logits))  # the whole vocabulary, in any order: nothing is cut
        probs = np.exp(logits[ids].astype(np.float64) - best)
        return ids, probs / probs.sum()
    total = float(np.sum(np.exp(logits - best, dtype=np.float32), dtype=np.float64))
    k = INITIAL_POOL
    while True:
        ids = top_ids(logits, k)
        probs = np.exp(logits[ids].astype(np.float64) - best) / total
        if k >= len(logits) or probs.sum() >= top_p:
            return ids, probs
        k *= 8


def _first_forced(constraint: Constraint | None) -> int | None:
    """The first token the grammar forces next (its canonical tokenization), or None."""
    if constraint is None:
        return None
    forced = constraint.forced()
    return int(forced[0]) if forced else None


def _masked_keeping(constraint: Constraint, logits: np.ndarray, token: int) -> np.ndarray:
    """The masked row, with `token` (which the grammar's check admits) keeping its logit."""
    masked = constraint.masked(logits)
    masked[token] = logits[token]
    return masked


def _with_logprobs(logits: np.ndarray, token: int, n_top: int) -> Choice:
    best = float(logits.max())
    log_total = best + float(np.log(np.sum(np.exp(logits - best, dtype=np.float32), dtype=np.float64)))
    chosen = float(logits[token]) - log_total
    if n_top <= 0:
        return Choice(token, chosen)
    top_ids = np.argpartition(logits, len(logits) - n_top)[len(logits) - n_top:]
    top_ids = top_ids[np.argsort(-logits[top_ids], kind="stable")]
    top = tuple((int(t), float(logits[t]) - log_total) for t in top_ids if np.isfinite(logits[t]))  # not what a mask forbids
    return Choice(token, chosen, top)
