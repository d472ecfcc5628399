"""The cost line against polluted timings: one-off spikes, contended bursts, absurd fits.

Table tests without a model: the timings are what a host with a known line would measure,
plus the pollution a shared 2-core box adds. Each case checks the line and the draft lengths
the controller then chooses against those it chooses with the clean line.
"""

from __future__ import annotations

import time

import pytest

from node.engine.cost_line import fit_line, fit_samples
from node.engine.hooks import Draft, DraftAsk, DraftSeq
from node.speculative.controller import Controller, ControllerConfig
from node.speculative.costs import DRIFT_STEPS, REFIT_EVERY, CostCurve

PER_STEP, PER_TOKEN = 0.018, 0.0035  # the quiet host: a row is 0.16 of a one-token step


def true_seconds(n_seqs: int, k: int) -> float:
    return PER_STEP + PER_TOKEN * n_seqs * (k + 1)


class Host:
    """measure(n_seqs, k) of a host with the true line, plus pollution by call number."""

    def __init__(self, pollute=lambda call, n_seqs, k, seconds: seconds) -> None:
        self.calls = 0
        self.pollute = pollute

    def __call__(self, n_seqs: int, k: int) -> float:
        self.calls += 1
        return self.pollute(self.calls, n_seqs, k, true_seconds(n_seqs, k))


class Always:
    name, cost_per_token = "lookup", 0.0

    def begin(self, seq): ...
    def end(self, seq, tokens): ...

    def propose(self, seq, context, k):
        return Draft(tuple(range(k)), self.name)


def draft_lengths(curve: CostCurve, acceptance: float, n_users: int) -> list[int]:
    """What the controller drafts for n_users sequences whose drafts are kept at `acceptance`
    per position, over 80 steps (the curve held fixed: steps are not observed)."""
    controller = Controller([Always()], ControllerConfig(max_draft=16, n_parallel=4), costs=curve)
    seqs = [DraftSeq(i + 1, i, (1, 2, 3), False) for i in range(n_users)]
    for seq in seqs:
        controller.begin(seq)
    lengths = []
    for step in range(80):
        plan = controller.plan(n_users, [DraftAsk(seq, [1, 2, 3], 16) for seq in seqs], 0, 256)
        for seq in seqs:
            draft = plan.drafts.get(seq.key)
            n = len(draft.tokens) if draft else 0
            lengths.append(n)
            if draft:
                kept = 0
                while kept < n and (step * 7 + kept * 13 + seq.key) % 100 < acceptance * 100:
                    kept += 1
                controller.verified(seq, draft, kept)
    return lengths[-20:]


def calibrated(host: Host) -> CostCurve:
    curve = CostCurve()
    curve.calibrate(host, n_parallel=4, max_draft=16)
    return curve


def close_to_truth(curve: CostCurve) -> bool:
    return abs(curve.intercept - PER_STEP) < 0.1 * PER_STEP and abs(curve.slope - PER_TOKEN) < 0.1 * PER_TOKEN


CLEAN = calibrated(Host())


def first_multi_row_step_pays_once(call, n_seqs, k, seconds):
    return seconds + (0.26 if n_seqs * (k + 1) > 1 and call <= 3 else 0.0)


def one_spike_per_size(call, n_seqs, k, seconds):
    return seconds * (12.0 if call % 11 == 5 else 1.0)


def contended_round(call, n_seqs, k, seconds):  # another process took a core for a few steps
    return seconds * 3.0 + 0.05 if 20 <= call < 27 else seconds


@pytest.mark.parametrize("pollution", [first_multi_row_step_pays_once, one_spike_per_size, contended_round])
def test_a_calibration_through_pollution_finds_the_quiet_line_and_the_same_drafts(pollution):
    assert close_to_truth(CLEAN)
    curve = calibrated(Host(pollution))
    assert close_to_truth(curve), (curve.intercept, curve.slope)
    for acceptance, users in ((0.9, 1), (0.6, 1), (0.6, 4), (0.3, 4)):
        assert draft_lengths(curve, acceptance, users) == draft_lengths(CLEAN, acceptance, users)


def test_the_old_calibration_fit_a_one_off_spike_as_the_slope():
    """What a start logged before: 1 tok 33.7 ms, 2 tok 293.4 ms -> 0.0 ms + 259.68 ms per token.
    A line no host has: now bounded, and a calibration with two sizes keeps the default line."""
    line = fit_line({1: 0.0337, 2: 0.2934})
    assert line is not None and line.clamped
    assert 0 <= line.per_token <= 0.0337 and line.per_step + line.per_token <= 0.0337 + 1e-12


def test_a_contended_fit_cannot_have_a_fixed_cost_above_a_whole_step():
    """A refit once logged 1624.3 ms + 25.46 ms per token with one-token steps of ~30 ms."""
    line = fit_samples({1: [0.030, 0.031, 0.029], 3: [1.70, 0.09, 0.08], 9: [1.85, 1.9, 0.25]})
    assert line is not None and 0 <= line.per_step <= 0.031 and 0 <= line.per_token <= 0.031


def test_a_burst_of_load_in_one_window_does_not_move_the_shape_but_a_lasting_change_does():
    curve = calibrated(Host())
    quiet = curve.slope
    for i in range(REFIT_EVERY):  # one window of contended steps, then quiet again
        n = (1, 9)[i % 2]
        curve.observe(n, 0.03 + 0.02 * n)
    for i in range(REFIT_EVERY):
        n = (1, 9)[i % 2]
        curve.observe(n, PER_STEP + PER_TOKEN * n)
    assert abs(curve.slope - quiet) < 1e-9
    for i in range(3 * REFIT_EVERY):  # the neighbour stays: every extra row costs 4x
        n = (1, 9)[i % 2]
        curve.observe(n, 0.03 + 0.014 * n)
    assert curve.refits >= 1 and abs(curve.slope - 0.014) < 1e-6


def test_drift_recalibrations_back_off_and_stay_within_their_budget():
    curve = calibrated(Host())
    waits = []
    for _ in range(3):
        for _ in range(20 * DRIFT_STEPS):  # five times slower, one size: no refit, only the scale
            curve.observe(4, 5 * (curve.intercept + curve.slope * 4))
            if curve._drift_steps >= DRIFT_STEPS:
                break
        assert curve._drift_steps >= DRIFT_STEPS
        waits.append(curve._recalibrate_after)
        curve._calibrated_at = float("-inf")  # as if the wait were over
        assert curve.drifted
        curve.calibrate(Host(lambda call, n, k, s: 5 * s), n_parallel=4, max_draft=16)
    assert waits[2] > waits[1] > waits[0] > 0  # each drift calibration pushes the next one further out

    def slow(n_seqs: int, k: int) -> float:
        time.sleep(0.01)
        return true_seconds(n_seqs, k)

    fresh = CostCurve()
    start = time.monotonic()
    fresh.calibrate(slow, n_parallel=4, max_draft=16, budget_s=0.05)
    assert time.monotonic() - start < 1.0 and fresh.measured  # one round (and the warm-up), not five
