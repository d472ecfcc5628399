"""Verification of draft tokens against the target's own choices: exact by construction.

A decoding sequence's batch entry is its next token followed by the draft, with logits on
every row. Row j is the target's distribution after the token at entry position j. The
sequence's own sampler chooses from row 0, 1, ... in order (argmax when greedy; a draw
from its own RNG when sampling) and the draft token at j + 1 is kept while it equals the
choice at j. The first disagreement ends the walk: that choice is the recovered token;
when every draft token was kept, the choice from the last row is the bonus token.

Since every choice is drawn exactly as plain decoding would draw it (same row, same
history, the random number of that position), the output is the target's: greedy text is
identical to plain decoding and a seeded sample draws the same tokens, up to the kernels'
near-ties (a row computed in a batch of another shape can differ in its last bits). This
holds for every deterministic draft (lookup, the Palimpsest, a greedy draft model). A greedy
choice keeps the draft's token where it is within DRAFT_TIE_NATS of the best, and a seeded
draw where its logit raised by DRAFT_TIE_NATS would have drawn it (node/engine/sampling.py;
an unseeded draw never, so its distribution stays the target's): at such a near-tie the
batch shape decides anyway, and keeping
the draft lets a repeated request follow its stored answer instead of leaving it there. The
row after the last draft token (or the one row of a sequence decoding without a draft) does
the same with the token the source expects there (`Draft.after`, `StepPlan.hints`), so a
replay does not leave its stored answer at a near-tie just because a draft ended there.

A sampled sequence's draft that carries the distributions its tokens were drawn from (a
draft model sampling) is verified by rejection sampling instead (`choose_against`: the
draft token x kept with probability min(1, p(x) / q(x)), otherwise a token drawn from the
residual max(0, p - q)), which keeps more of a sampled draft than waiting for the target
to draw the same token, and is distributed exactly as the target (Leviathan et al. 2023,
Chen et al. 2023). Its random numbers (acceptance, residual) are not plain decoding's, so it
serves unseeded requests only: a seeded request's draft model draws with the target's own
noise and no distribution (node/speculative/draft_model.py), and its draft is verified as a
deterministic one, so the seeded text is plain decoding's whatever the draft lengths were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from node.engine.sampling import Choice
from node.engine.types import FinishReason


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the target made of one entry: tokens kept in the KV and why the sequence ends."""

    n_valid: int                  # entry tokens whose KV stays (the next token + kept drafts)
    accepted: int                 # draft tokens kept
    generated: int                # tokens chosen this step (kept drafts + recovered or bonus)
    reason: FinishReason | None   # the sequence ends (None: it goes on)


Against = Callable[[np.ndarray, int, tuple[np.ndarray, np.ndarray]], tuple[Choice, bool]]


def verify(tokens: list[int], rows: np.ndarray, choose: Callable[[np.ndarray, int | None], Choice],
           take: Callable[[Choice], FinishReason | None], *,
           dists: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None,
           choose_against: Against | None = None, after: int | None = None) -> Verdict:
    """Walk the entry's rows: `choose(row, draft token or None)` picks the target's token (greedy
    keeps the draft token at a near-tie, sampling.DRAFT_TIE_NATS), `take(choice)` appends it
    to the sequence (and says whether that ends it). tokens[0] is the already-chosen next
    token, tokens[1:] the draft; rows has one row per entry token. With `dists` (the draft's
    distributions, one per draft token) and `choose_against(row, token, dist)`, each draft
    token is judged by rejection sampling; the row after the last one picks the bonus token,
    with `after` (the token the draft's source expects there, `Draft.after`) as its draft token:
    a greedy choice keeps it at a near-tie, but it is no row and never counts as kept."""
    n_valid = 1
    reason: FinishReason | None = None
    generated = 0
    for j in range(len(tokens)):
        drafted = j + 1 < len(tokens)
        if drafted and dists is not None and choose_against is not None:
            choice, kept = choose_against(rows[j], tokens[j + 1], dists[j])
        else:
            choice = choose(rows[j], tokens[j + 1] if drafted else after)
            kept = drafted and choice.token == tokens[j + 1]
        reason = take(choice)
        generated += 1
        if reason is None and kept:
            n_valid += 1
            continue
        break
    return Verdict(n_valid, n_valid - 1, generated, reason)
