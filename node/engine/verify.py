"""Verification of draft tokens against the target's own choices: exact by construction.

A decoding sequence's batch entry is its next token followed by the draft, with logits on
every row. Row j is the target's distribution after the token at entry position j. The
sequence's own sampler chooses from row 0, 1, ... in order (argmax when greedy; a draw
from its own RNG when sampling) and the draft token at j + 1 is kept while it equals the
choice at j. The first disagreement ends the walk: that choice is the recovered token;
when every draft token was kept, the choice from the last row is the bonus token.

Since every choice is drawn exactly as plain decoding would draw it (same row, same
history, one RNG draw per generated token), the output is the target's: greedy text is
identical to plain decoding and a seeded sample consumes the same random numbers. This
holds for every deterministic draft (lookup, the Palimpsest); a draft carrying
probabilities is verified the same way (it stays exact, it is only less likely to be
kept than with residual resampling).
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


def verify(tokens: list[int], rows: np.ndarray, choose: Callable[[np.ndarray], Choice],
           take: Callable[[Choice], FinishReason | None]) -> Verdict:
    """Walk the entry's rows: `choose(row)` picks the target's token, `take(choice)` appends it
    to the sequence (and says whether that ends it). tokens[0] is the already-chosen next
    token, tokens[1:] the draft; rows has one row per entry token."""
    n_valid = 1
    reason: FinishReason | None = None
    generated = 0
    for j in range(len(tokens)):
        choice = choose(rows[j])
        reason = take(choice)
        generated += 1
        if reason is None and j + 1 < len(tokens) and choice.token == tokens[j + 1]:
            n_valid += 1
            continue
        break
    return Verdict(n_valid, n_valid - 1, generated, reason)
