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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.engine.types import Finished

NEAR_TIE = 0.4


def assert_same_up_to_near_ties(reference: tuple[Finished, list], got: Finished) -> None:
    """`got` generated what the reference run did (its Finished and its logprobs, top 2 at least),
    or parted from it only where the reference's two best tokens were within NEAR_TIE."""
    (expected, logprobs), a, b = reference, reference[0].generated, got.generated
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        assert a == b
        return
    gap = logprobs[first].top[0][2] - logprobs[first].top[1][2]
    assert gap < NEAR_TIE, f"diverged at token {first} with a clear margin {gap:.3f}"
