"""The one bound every "same output" test allows a greedy divergence under.

llama.cpp's CPU kernels are not batch-invariant: a row computed in a step of another shape can
come out a little different. bench/batch_invariance.py measured it on the real model (36
prompts). On a Xeon running without extra buffer types (2026-12-01), steps of up to five rows
(a verify step with four drafts, four users' single tokens) reproduce the one-token step's
logits exactly; a 17-row verify step and a one-step prefill move a logit by up to 1.28 and the
gap between the two best tokens by up to 0.26 nats. On an AMD EPYC with repacked weights
(2026-12-02) every shape but one row moves a logit by up to 1.18 and the gap by up to 0.17, a
one-step prefill by 1.29 and 0.35. Both moved the argmax in 2 of 36 prefills. So two greedy
runs of one build (with speculation on and off, cache on and off) may part only where the
plain run's top-2 gap is under NEAR_TIE: 0.4 nats, above the largest move measured on either
host. A divergence at a wider gap is a defect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from node.engine.types import Finished, SamplingParams

NEAR_TIE = 0.4


def reference_of(events: list) -> tuple[Finished, list]:
    """A run's events as `assert_same_up_to_near_ties` takes its reference: the Finished and the
    logprobs of every token, in order."""
    from node.engine.types import TextDelta

    return events[-1], [lp for e in events[:-1] if isinstance(e, TextDelta) for lp in e.logprobs]


def first_parting(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (None where one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def assert_same_up_to_near_ties(reference: tuple[Finished, list], got: Finished) -> None:
    """`got` generated what the reference run did (its Finished and its logprobs, top 2 at least),
    or parted from it only where the reference's two best tokens were within NEAR_TIE."""
    (expected, logprobs), a, b = reference, reference[0].generated, got.generated
    first = first_parting(a, b)
    if first is None:
        assert a == b
        return
    gap = logprobs[first].top[0][2] - logprobs[first].top[1][2]
    assert gap < NEAR_TIE, f"diverged at token {first} with a clear margin {gap:.3f}"


def draw_near_an_edge(params: SamplingParams, n_vocab: int, position: int, top: Sequence[tuple[int, float]]) -> bool:
    """Whether a seeded draw at `position`, replayed by the engine's own sampler over a plain run's
    top logprobs (`top`: token id and logprob, the rest of the vocabulary left out), changes when
    one of those logits moves by NEAR_TIE: the draw fell near a tie of scores or near an edge of
    the top_p / min_p cut, where another step's shape may draw otherwise. A seeded sample may part
    from the plain one only at such a draw."""
    import numpy as np

    from node.engine.sampling import TokenSampler

    logits = np.full(n_vocab, -1e30, dtype=np.float32)
    for token, logprob in top:
        logits[token] = logprob
    history = [0] * position

    def pick(row: np.ndarray) -> int:
        return TokenSampler(params, n_vocab).choose(row, history).token

    plain = pick(logits)
    for token, _ in top:
        for shift in (-NEAR_TIE, NEAR_TIE):
            moved = logits.copy()
            moved[token] += shift
            if pick(moved) != plain:
                return True
    return False
