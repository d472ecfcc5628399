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

NEAR_TIE = 0.4
