"""The controller without a model: draft lengths from acceptance and the cost curve, switching off and on."""

from __future__ import annotations

import logging

from node.engine.hooks import Draft, DraftSeq
from node.speculative.controller import BACKOFF_START, PROBE_TOKENS, SWITCH_OFF, Controller, ControllerConfig
from node.speculative.costs import CostCurve


class Fixed:
    """A source always proposing the same tokens."""

    def __init__(self, name: str, tokens: tuple[int, ...], cost_per_token: float = 0.0) -> None:
        self.name, self.tokens, self.cost_per_token = name, tokens, cost_per_token
        self.asked: list[int] = []

    def begin(self, seq): ...
    def end(self, seq, tokens): ...

    def propose(self, seq, context, k):
        self.asked.append(k)
        return Draft(self.tokens[:k], self.name) if self.tokens else None


def linear(per_step: float = 0.012, per_token: float = 0.0012) -> CostCurve:
    return CostCurve({n: per_step + per_token * n for n in (1, 2, 4, 8, 16, 32, 68)})


SEQ = DraftSeq(1, 1, (1, 2, 3), False)


def run(controller: Controller, n_steps: int, accepted_of) -> list[int]:
    lengths = []
    if SEQ.key not in controller._seqs:
        controller.begin(SEQ)
    for _ in range(n_steps):
        controller.start_step(1)
        draft = controller.propose(SEQ, [1, 2, 3], 16)
        n = len(draft.tokens) if draft else 0
        lengths.append(n)
        if draft:
            controller.verified(SEQ, draft, accepted_of(n))
        controller.step_done(1, 1 + n, 0.012 + 0.0012 * (1 + n))  # what the linear() host costs
    return lengths


def test_cost_curve_fits_a_line_that_one_disturbed_step_does_not_bend_and_follows_the_host():
    curve = CostCurve({1: 0.011, 2: 0.012, 4: 0.014, 8: 0.018, 12: 0.9, 16: 0.026})  # 12: another process ran
    assert abs(curve.slope - 0.001) < 1e-9 and abs(curve.seconds(3) - 0.013) < 1e-9
    for _ in range(200):
        curve.observe(4, 0.028)  # the host got twice as slow
    assert 1.9 < curve.scale < 2.05 and abs(curve.seconds(1) / 0.011 - curve.scale) < 1e-6


def test_cost_curve_calibrates_from_measured_steps():
    calls = []

    def measure(n_seqs, k):
        calls.append((n_seqs, k))
        return 0.01 + 0.001 * n_seqs * (k + 1)

    curve = CostCurve()
    curve.calibrate(measure, n_parallel=4, max_draft=16)
    assert curve.measured and (1, 16) in calls and (4, 16) in calls
    assert abs(curve.seconds(68) - 0.078) < 1e-9


def test_calibration_gives_way_to_waiting_requests():
    from node.speculative.costs import _shapes

    warm_up = len(_shapes(4, 16))
    answers = iter([0.01] * warm_up + [0.01, 0.011, 0.012, None])
    curve = CostCurve()
    curve.calibrate(lambda n_seqs, k: next(answers), n_parallel=4, max_draft=16)
    assert curve.measured and set(curve.points) == {1, 2, 3}  # the warm-up, then three sizes
    short = iter([0.01] * warm_up + [0.01, 0.2, None])  # two sizes: one outlier away from any line
    two = CostCurve()
    two.calibrate(lambda n_seqs, k: next(short), n_parallel=4, max_draft=16)
    assert not two.measured and (two.intercept, two.slope) == (CostCurve().intercept, CostCurve().slope)
    waiting = CostCurve()
    waiting.calibrate(lambda n_seqs, k: None, n_parallel=4, max_draft=16)
    assert not waiting.measured and waiting.seconds(1) > 0


def test_good_drafts_grow_long_and_bad_ones_stop():
    controller = Controller([Fixed("good", tuple(range(16)))], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 60, lambda n: n)
    assert lengths[-1] == 16
    controller = Controller([Fixed("bad", tuple(range(16)))], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 200, lambda n: 0)
    assert sum(lengths[-100:]) <= 3 * 2  # off, with at most a couple of short probes


def test_expensive_verification_means_no_drafts():
    # every extra token costs as much as a whole step: even 60% acceptance does not pay
    controller = Controller([Fixed("meh", tuple(range(8)))], ControllerConfig(max_draft=8),
                            costs=CostCurve({1: 0.01, 2: 0.02, 16: 0.16}))
    lengths = run(controller, 100, lambda n: min(n, 1))
    assert sum(lengths[:SWITCH_OFF]) == 0 and sum(lengths) <= 2 * PROBE_TOKENS  # at most re-probes


def test_a_source_switched_off_is_reprobed_with_backoff_and_logged(caplog):
    accept = {"n": 0}
    controller = Controller([Fixed("src", tuple(range(8)))], ControllerConfig(max_draft=8), costs=linear())
    with caplog.at_level(logging.INFO, logger="node.speculative.controller"):
        run(controller, SWITCH_OFF * 4, lambda n: accept["n"])
        assert controller.stats["src"].switched_off >= 1 and not controller.state()["src"]["on"]
        assert any("switched off" in r.getMessage() for r in caplog.records)
        accept["n"] = 8  # the workload changes: everything is kept now
        lengths = run(controller, BACKOFF_START * 8, lambda n: min(n, accept["n"]))
    assert controller.stats["src"].switched_on >= 1 and controller.state()["src"]["on"]
    assert any("switched on" in r.getMessage() for r in caplog.records)
    assert lengths[-1] == 8


def test_a_busy_batch_gets_shorter_drafts_than_a_lone_sequence():
    # a weight-read-bound step: extra tokens are cheap next to a lone token, not next to a full batch
    def plan(n_decoding: int) -> int:
        controller = Controller([Fixed("half", tuple(range(16)))], ControllerConfig(max_draft=16),
                                costs=linear(0.012, 0.004))
        controller._sources["half"].p = [0.6] * 16
        controller.start_step(n_decoding)
        total = 0
        for key in range(n_decoding):
            s = DraftSeq(key, key, (), False)
            controller.begin(s)
            draft = controller.propose(s, [1], 16)
            total += len(draft.tokens) if draft else 0
        return total

    assert plan(1) > 0 and plan(4) / 4 < plan(1)


def test_stats_by_position_and_histogram():
    controller = Controller([Fixed("s", (1, 2, 3, 4))], ControllerConfig(max_draft=4), costs=linear())
    controller.begin(SEQ)
    controller.verified(SEQ, Draft((1, 2, 3, 4), "s"), 2)
    controller.step_done(1, 5, 0.02)
    snap = controller.stats.snapshot()["s"]
    assert snap["drafted"] == 4 and snap["accepted"] == 2
    assert snap["acceptance_by_position"][:3] == [1.0, 1.0, 0.0] and snap["acceptance_by_position"][3] is None
    assert snap["accepted_lengths"] == [0, 0, 1, 0, 0] and snap["verify_seconds"] > 0


def test_cost_curve_refits_its_shape_from_the_steps_the_engine_ran():
    curve = linear(per_step=0.010, per_token=0.0026)  # calibrated on a quiet host
    for i in range(128):  # a neighbour took a core: every extra token costs far more
        n = (1, 9)[i % 2]
        curve.observe(n, 0.028 + 0.0175 * (n - 1))
    assert curve.refits >= 1 and abs(curve.slope - 0.0175) < 1e-6
    assert abs(curve.seconds(9) / curve.seconds(1) - (0.028 + 0.14) / 0.028) < 0.05


def test_cost_curve_asks_for_a_calibration_when_the_host_changes_speed():
    curve = linear()
    for _ in range(10):
        curve.observe(4, curve.seconds(4))
    assert not curve.drifted
    for _ in range(200):
        curve.observe(4, 3 * 0.0168)  # three times slower, one size only: no refit possible
    assert curve.drifted
    controller = Controller([], costs=curve)
    assert controller.calibration_due()
    curve.calibrate(lambda n_seqs, k: 0.03 + 0.003 * n_seqs * (k + 1), n_parallel=4, max_draft=16)
    assert not curve.drifted and curve.calibrations == 1


def test_a_source_whose_drafts_cost_time_is_asked_for_what_pays_and_dropped_when_too_slow():
    cheap = Fixed("model", tuple(range(16)), cost_per_token=0.001)
    controller = Controller([cheap], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 60, lambda n: n)
    assert lengths[-1] >= 8 and cheap.asked[-1] == lengths[-1]  # asked for no more than it verifies
    slow = Fixed("model", tuple(range(16)), cost_per_token=0.05)  # each token costs 4 plain steps to make
    controller = Controller([slow], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 100, lambda n: n)
    assert sum(lengths) <= 2 * 3 and not controller.state()["model"]["on"]  # off, but for short probes


def test_saved_seconds_count_the_time_spent_making_drafts():
    free = Controller([Fixed("lookup", tuple(range(8)))], ControllerConfig(max_draft=8), costs=linear())
    made = Controller([Fixed("model", tuple(range(8)), cost_per_token=0.004)], ControllerConfig(max_draft=8),
                      costs=linear())
    for controller in (free, made):
        for source in controller._sources.values():
            source.probing = True  # verify a short draft whatever it costs: the same drafts in both
        run(controller, 1, lambda n: n)
    a, b = free.stats["lookup"], made.stats["model"]
    assert a.drafted == b.drafted > 0 and a.make_s == 0.0
    assert abs(b.make_s - 0.004 * b.drafted) < 1e-12 and abs((a.saved_s - b.saved_s) - b.make_s) < 1e-12
    assert made.stats.snapshot()["model"]["making_seconds"] == round(b.make_s, 6)
