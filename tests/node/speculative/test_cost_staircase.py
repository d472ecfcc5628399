"""The cost curve as a staircase: where the output projection works in tiles of rows, a step
of 5 rows with logits costs what 8 cost; and where a lone row runs cheaper kernels, a
one-token step costs less than the line through the larger ones. Table tests without a
model: the points are what the AMX-trapping Xeon and an AVX2-only EPYC measured
(docs/BENCHMARKS.md), or a plain line with noise."""

from __future__ import annotations

import random

import pytest

from node.engine.cost_line import fit_line, fit_steps
from node.engine.hooks import DraftAsk, DraftSeq
from node.speculative.controller import ANY, Controller, ControllerConfig
from node.speculative.costs import BEND_NOISE, PROBE_SIZES, REFIT_EVERY, CostCurve
from tests.node.speculative.test_controller import Own, establish

# ms by tokens with logits in one step, one sequence, 80 tokens of context (min of 7)
XEON_MS = {1: 20.9, 2: 23.3, 3: 26.5, 4: 30.4, 5: 45.0, 6: 49.1, 7: 52.1, 8: 44.6, 9: 58.7, 12: 54.3,
           16: 64.6, 17: 79.9, 32: 113.0}
XEON = {n: ms / 1000 for n, ms in XEON_MS.items()}
# the engine's calibration medians on an AVX2-only EPYC (family 23): odd counts cost what the
# next even one does, and a lone row a third less than the line through 2..16 rows
EPYC_MS = {1: 37.0, 2: 68.3, 3: 109.5, 4: 104.2, 5: 144.9, 6: 140.7, 7: 186.2, 8: 175.0, 9: 213.0, 12: 246.3,
           16: 321.4, 17: 397.3, 32: 609.8, 68: 1374.1}
EPYC = {n: ms / 1000 for n, ms in EPYC_MS.items()}


def test_a_staircase_is_found_where_the_steps_show_one_and_prices_every_size():
    line = fit_steps(XEON)
    assert line is not None and line.tile == 4 and 0.010 < line.tail < 0.017
    for n, seconds in XEON.items():
        assert abs(line.seconds(n) - seconds) / seconds < 0.08, n
    assert line.seconds(5) > line.seconds(8) and line.seconds(9) > line.seconds(12)
    plain = fit_line(XEON)
    assert plain is not None and abs(plain.seconds(5) - XEON[5]) / XEON[5] > 0.2  # the line misprices 5 rows
    assert "multiple of 4" in line.describe() and line.as_dict()["tile"] == 4


def test_a_line_with_noise_stays_a_line():
    rng = random.Random(7)
    for _ in range(20):
        points = {n: (0.018 + 0.0033 * n) * rng.uniform(0.95, 1.05) for n in PROBE_SIZES}
        line = fit_steps(points)
        assert line is not None and line.tile == 1 and line.tail == 0.0 and line.solo == 0.0


def test_the_calibration_measures_both_sides_of_a_tile():
    assert {4, 5, 8, 9, 12, 16, 17} <= set(PROBE_SIZES)


def xeon_measure(n_seqs: int, k: int) -> float:
    return fit_steps(XEON).seconds(n_seqs * (k + 1))  # type: ignore[union-attr]


def test_a_lone_row_cheaper_than_the_line_is_priced_apart():
    line = fit_steps(EPYC)
    assert line is not None and line.tile == 2 and 0.010 < line.solo < 0.016
    for n, seconds in EPYC.items():
        if n < 68:
            assert abs(line.seconds(n) - seconds) / seconds < 0.1, n
    plain = fit_line(EPYC)
    assert plain is not None and abs(plain.seconds(3) - EPYC[3]) / EPYC[3] > 0.25  # the line misprices a 2-token draft
    assert line.seconds(1) == EPYC[1] and line.seconds(2) > 1.8 * line.seconds(1)
    assert "one-token step costs" in line.describe() and line.as_dict()["solo"] > 10
    assert fit_steps(XEON).solo == 0.0  # type: ignore[union-attr]  # where the lone row is on the line


def test_refits_from_a_busy_batch_keep_the_lone_rows_discount():
    epyc = fit_steps(EPYC)
    assert epyc is not None
    curve = CostCurve()
    curve.calibrate(lambda n_seqs, k: epyc.seconds(n_seqs * (k + 1)), 4, 16, budget_s=60)
    solo = curve.shape.solo
    assert solo > 0.010
    for i in range(4 * REFIT_EVERY):  # four users: never a lone row, slower host (x1.5)
        n = (4, 6, 8)[i % 3]
        curve.observe(n, 1.5 * epyc.seconds(n))
    assert curve.refits >= 1 and abs(curve.shape.solo / solo - 1.5) < 0.2


def test_calibration_and_refits_keep_the_staircase():
    curve = CostCurve()
    curve.calibrate(xeon_measure, 4, 16, budget_s=60)
    assert curve.tile == 4 and curve.seconds(5) > curve.seconds(8)
    tail = curve.tail
    for i in range(4 * REFIT_EVERY):  # service where the planner kept to the tile: sizes 4 and 8 only
        n = (4, 8)[i % 2]
        curve.observe(n, xeon_measure(1, n - 1))
    assert curve.refits >= 1 and curve.tile == 4 and abs(curve.tail - tail) / tail < 0.2


def plan_lengths(curve: CostCurve, acceptance: list[float]) -> list[int]:
    controller = Controller([Own(k) for k in range(len(acceptance))], ControllerConfig(max_draft=16), costs=curve)
    seqs = [DraftSeq(k, k, (), False) for k in range(len(acceptance))]
    for seq, p in zip(seqs, acceptance):
        establish(controller, f"s{seq.key}", [p] * 16, ANY)
        controller.begin(seq)
    plan = controller.plan(len(seqs), [DraftAsk(s, [1], 16) for s in seqs], 0, 256)
    return [len(plan.drafts[s.key].tokens) if s.key in plan.drafts else 0 for s in seqs]


def test_on_a_staircase_a_batch_of_four_drafts_a_whole_tile_or_nothing():
    stairs = CostCurve(dict(XEON), fixed=True)
    line = CostCurve({n: fit_line(XEON).seconds(n) for n in XEON}, fixed=True)  # type: ignore[union-attr]
    assert stairs.tile == 4 and line.tile == 1
    # one user of four loops (its drafts kept 80% a position), three have nothing to draft:
    # the line buys a row or two for it, which on this host costs the other three 14 ms a step
    assert 0 < sum(plan_lengths(line, [0.8, 0.0, 0.0, 0.0])) < 4
    assert sum(plan_lengths(stairs, [0.8, 0.0, 0.0, 0.0])) in (0, 4, 8, 12)
    # drafts that are kept: rows to a multiple of the tile
    for acceptance in ([0.95, 0.9, 0.0, 0.0], [0.97, 0.97, 0.97, 0.97], [0.9, 0.5, 0.3, 0.0]):
        assert (4 + sum(plan_lengths(stairs, acceptance))) % 4 == 0, acceptance


# the engine's calibration medians on the AMX-trapping Xeon, empty slots: 8 rows cost 4 ms more
# than the staircase through every size says, 32 rows 6 ms less
XEON_CALIBRATED_MS = {1: 23.4, 2: 26.0, 3: 29.3, 4: 32.9, 5: 48.5, 6: 53.0, 7: 56.7, 8: 50.8, 9: 67.0, 12: 60.7,
                      16: 73.9, 17: 92.6, 32: 123.1, 68: 268.3}
XEON_CALIBRATED = {n: ms / 1000 for n, ms in XEON_CALIBRATED_MS.items()}


def unbent(points: dict[int, float]) -> CostCurve:
    curve = CostCurve(dict(points), fixed=True)
    curve.bends = {}
    return curve


def test_the_curve_prices_each_calibrated_size_at_what_it_measured_and_the_rest_between_their_neighbours():
    curve = CostCurve(dict(XEON_CALIBRATED), fixed=True)
    assert curve.tile == 4 and abs(unbent(XEON_CALIBRATED).seconds(8) - 0.0466) < 0.001  # the shape alone
    for n, seconds in XEON_CALIBRATED.items():
        assert curve.seconds(n) == pytest.approx(seconds, rel=BEND_NOISE), n
    # 24 rows (on the tile) between 16 and 32; 10 rows (off it) between 9 and 17, not between 8 and 12
    assert curve.bend(24) == pytest.approx((curve.bend(16) + curve.bend(32)) / 2)
    assert curve.bend(10) == pytest.approx(curve.bend(9) + (curve.bend(17) - curve.bend(9)) / 8)
    assert curve.seconds(10) > curve.seconds(12)


def test_the_bends_follow_the_host_and_survive_refits():
    curve = CostCurve()
    curve.calibrate(lambda n_seqs, k: XEON_CALIBRATED[n_seqs * (k + 1)], 4, 16, budget_s=60)
    bend8 = curve.bend(8)
    assert bend8 > 1.05
    for i in range(4 * REFIT_EVERY):  # four users on a host 1.5x as slow: steps of 4 and 8 rows
        n = (4, 8)[i % 2]
        curve.observe(n, 1.5 * XEON_CALIBRATED[n])
    assert curve.refits >= 1 and curve.bend(8) == bend8
    assert curve.seconds(8) == pytest.approx(1.5 * XEON_CALIBRATED[8], rel=0.05)
    assert curve.seconds(4) == pytest.approx(1.5 * XEON_CALIBRATED[4], rel=0.05)


def test_four_users_with_middling_odds_draft_nothing_where_eight_rows_cost_more_than_the_line_says():
    # each of four users has drafts kept 55% a position: on the line, 4 rows more cost 13.7 ms
    # and buy 2.2 tokens (a step of 4 is 32.9 ms), 1.3x plain decoding's rate, so the plan
    # drafts a token each; the 4 rows cost 17.9 ms
    bent = CostCurve(dict(XEON_CALIBRATED), fixed=True)
    assert plan_lengths(unbent(XEON_CALIBRATED), [0.55] * 4) == [1, 1, 1, 1]
    assert plan_lengths(bent, [0.55] * 4) == [0, 0, 0, 0]
    assert plan_lengths(bent, [0.7] * 4) == [2, 2, 2, 2]  # 12 rows cost 60.7 ms: two each pays
