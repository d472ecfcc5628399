"""The controller without a model: draft lengths from acceptance and the cost curve, switching off and on."""

from __future__ import annotations

import logging
from typing import Sequence

import pytest

from node.engine.hooks import Draft, DraftAsk, DraftSeq
from node.engine.types import SamplingParams
from node.speculative.controller import (ANY, BACKOFF_START, EMA, PRIOR, PRIOR_COUNT, PROBE_TOKENS, QUIET_PLANS,
                                         REST_MAX, SWITCH_OFF, Controller, ControllerConfig, _match_class)
from node.speculative import costs as costs_module
from node.speculative.cost_store import CostStore
from node.speculative.costs import BEND_LIMITS, CostCurve
from node.speculative.draining import Draining


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


class Matching(Fixed):
    """A source always proposing the same tokens, saying it matched `match` context tokens (of
    the sequence's own output where `echo`; a past answer to the same prompt where `replay`)."""

    match = 0
    echo = False
    replay = False

    def propose(self, seq, context, k):
        return Draft(self.tokens[:k], self.name, match=self.match, echo=self.echo, replay=self.replay)


def establish(controller: Controller, source: str, estimates: list[float], match_class: int = ANY) -> None:
    """Give a source greedy estimates as if learned from many drafts (so the next observations
    move them by EMA, not as the first few observations move a fresh estimate)."""
    state = controller._sources[source]
    state.p[(False, match_class)] = list(estimates)
    state.seen[(False, match_class)] = [1000] * len(estimates)


def linear(per_step: float = 0.012, per_token: float = 0.0012) -> CostCurve:
    return CostCurve({n: per_step + per_token * n for n in (1, 2, 4, 8, 16, 32, 68)})


SEQ = DraftSeq(1, 1, (1, 2, 3), False)


def run(controller: Controller, n_steps: int, accepted_of) -> list[int]:
    lengths = []
    if SEQ.key not in controller._seqs:
        controller.begin(SEQ)
    for _ in range(n_steps):
        draft = controller.plan(1, [DraftAsk(SEQ, [1, 2, 3], 16)], 0, 256).drafts.get(SEQ.key)
        n = len(draft.tokens) if draft else 0
        lengths.append(n)
        if draft:
            controller.verified(SEQ, draft, accepted_of(n))
        controller.step_done(1, 1 + n, 0.012 + 0.0012 * (1 + n))  # what the linear() host costs
    return lengths


def test_cost_curve_fits_a_line_that_one_disturbed_step_does_not_bend_and_follows_the_host():
    curve = CostCurve({1: 0.011, 2: 0.012, 4: 0.014, 8: 0.018, 12: 0.9, 16: 0.026})  # 12: another process ran
    assert abs(curve.slope - 0.001) < 1e-9 and abs(curve.seconds(3) - 0.013) < 1e-9
    assert curve.seconds(12) == pytest.approx(0.022 * BEND_LIMITS[1])  # its own bend, held to the limit
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


def test_a_slow_host_still_gets_three_rounds_of_calibration():
    from collections import Counter

    from node.speculative.costs import MIN_ROUNDS

    calls: Counter = Counter()

    def measure(n_seqs, k):
        calls[(n_seqs, k)] += 1
        return 0.01 + 0.001 * n_seqs * (k + 1)

    CostCurve().calibrate(measure, n_parallel=4, max_draft=16, budget_s=0.0)  # every round over budget
    assert MIN_ROUNDS >= 3 and set(calls.values()) == {1 + MIN_ROUNDS}  # the warm-up, then the rounds


def test_calibration_gives_way_to_waiting_requests():
    from node.speculative.costs import _runs, _shapes, _spread

    warm_up = len(_runs(_shapes(4, 16), _spread(4)))
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


def test_plans_that_verify_nothing_rest_and_a_draft_or_a_new_sequence_ends_the_rest(monkeypatch):
    """Prose: a free source whose drafts are never kept. Once QUIET_PLANS plans in a row verified
    nothing the planner rests between plans (1, 2, then REST_MAX steps), so the source is asked
    at a fraction of the steps; a sequence it has not planned for is planned at its first step;
    when the source's drafts start being kept, drafts come back within a rest and every step is
    planned again."""
    source = Fixed("bad", tuple(range(16)))
    controller = Controller([source], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 100, lambda n: 0)
    asked_then = len(source.asked)
    assert asked_then <= 100 // (REST_MAX + 1) + 3 * QUIET_PLANS + 10, asked_then
    assert sum(lengths[-50:]) == 0
    assert controller._rest == REST_MAX and controller._rest_left > 0
    rested = controller.planner_state()["steps_rested"]
    assert rested + asked_then >= 100 - 5 and rested >= 100 // 2  # every step asked the source or rested

    newcomer = DraftSeq(2, 2, (1, 2, 3), False)
    controller.begin(newcomer)
    before = len(source.asked)
    controller.plan(2, [DraftAsk(SEQ, [1, 2, 3], 16), DraftAsk(newcomer, [1, 2, 3], 16)], 0, 256)
    assert len(source.asked) == before + 2  # planned at once, both sequences asked
    controller.end(newcomer, [1, 2, 3])

    def turning(resting: bool) -> list[int]:
        """Draft lengths a step over 80 steps of a text that turns repetitive at step 40."""
        controller = Controller([Following(tuple(range(1000)))], ControllerConfig(max_draft=16), costs=linear())
        if not resting:
            monkeypatch.setattr(controller, "_resting", lambda keys: False)
        seq = DraftSeq(7, 7, (), False)
        controller.begin(seq)
        drafted: list[int] = []
        context: list[int] = []
        for step in range(80):
            plan = controller.plan(1, [DraftAsk(seq, context or [0], 16)], 0, 256)
            draft = plan.drafts.get(seq.key)
            kept = len(draft.tokens) if draft and step >= 40 else 0
            if draft:
                controller.verified(seq, draft, kept)
            drafted.append(len(draft.tokens) if draft else 0)
            context = list(range(len(context) + 1 + kept)) if step >= 40 else context + [10_000 + step]
            controller.step_done(1, 1 + drafted[-1], 0.012)
        return drafted

    rested, planned = turning(True), turning(False)
    first = [next(i for i, n in enumerate(lengths) if i >= 40 and n > 0) for lengths in (rested, planned)]
    assert first[1] <= first[0] <= first[1] + REST_MAX + 1, first  # a rest delays the first draft by a rest at most
    assert all(n > 0 for n in rested[first[0]:])  # and then every step is planned again


def test_expensive_verification_means_no_drafts():
    # every extra token costs as much as a whole step: even 60% acceptance does not pay
    controller = Controller([Fixed("meh", tuple(range(8)))], ControllerConfig(max_draft=8),
                            costs=CostCurve({1: 0.01, 2: 0.02, 16: 0.16}))
    lengths = run(controller, 100, lambda n: min(n, 1))
    assert sum(lengths[:SWITCH_OFF]) == 0 and sum(lengths) <= 2 * PROBE_TOKENS  # at most re-probes


def test_a_source_switched_off_is_reprobed_with_backoff_and_logged(caplog):
    # a source that costs time to ask (a draft model's decodes): switching it off saves that time
    accept = {"n": 0}
    controller = Controller([Fixed("src", tuple(range(8)), cost_per_token=1e-5)], ControllerConfig(max_draft=8),
                            costs=linear())
    with caplog.at_level(logging.INFO, logger="node.speculative.controller"):
        run(controller, SWITCH_OFF * 4 * (REST_MAX + 1), lambda n: accept["n"])  # plans rest once none verifies
        assert controller.stats["src"].switched_off >= 1 and not controller.state()["src"]["on"]
        assert any("switched off" in r.getMessage() for r in caplog.records)
        accept["n"] = 8  # the workload changes: everything is kept now
        lengths = run(controller, BACKOFF_START * 8, lambda n: min(n, accept["n"]))
    assert controller.stats["src"].switched_on >= 1 and controller.state()["src"]["on"]
    assert any("switched on" in r.getMessage() for r in caplog.records)
    assert lengths[-1] == 8


class Following:
    """A free source proposing the next tokens of a known text: right every time."""

    name, cost_per_token = "follows", 0.0

    def __init__(self, text: tuple[int, ...]) -> None:
        self.text = text

    def begin(self, seq): ...
    def end(self, seq, tokens): ...

    def propose(self, seq, context, k):
        return Draft(self.text[len(context):len(context) + k], self.name, match=16)


TEXT = tuple(range(100, 400))


def following(key: int) -> tuple[Controller, DraftSeq]:
    """A controller over `Following(TEXT)` on a host where a row costs 0.6 of a step (the output
    projection dominates), its estimates at 0.3 (what a run of other text left), and a
    sequence begun on TEXT's first 10 tokens: at those estimates a draft does not pay. (Its
    matches' class is set too: a class never judged starts from what its run says.)"""
    controller = Controller([Following(TEXT)], ControllerConfig(max_draft=16),
                            costs=CostCurve({n: 0.012 + 0.018 * n for n in (1, 2, 4, 8, 16, 32, 68)}))
    for match_class in (ANY, _match_class(16)):
        establish(controller, "follows", [0.3] * 16, match_class)
    seq = DraftSeq(key, key, TEXT[:10], False)
    controller.begin(seq)
    return controller, seq


def test_a_free_source_learns_from_proposals_it_did_not_verify_and_is_never_switched_off(caplog):
    # nothing is verified at first; the generated text follows the proposals, and the shadows
    # alone raise the estimates until drafts pay
    controller, seq = following(7)
    context, lengths = list(TEXT[:10]), []
    with caplog.at_level(logging.INFO, logger="node.speculative.controller"):
        while len(context) < 200:
            draft = controller.plan(1, [DraftAsk(seq, list(context), 16)], 0, 256).drafts.get(seq.key)
            n = len(draft.tokens) if draft else 0
            if draft:
                controller.verified(seq, draft, n)
            lengths.append(n)
            context = list(TEXT[:len(context) + 1 + n])
    assert lengths[0] == 0  # it did not pay at first
    first = next(i for i, n in enumerate(lengths) if n)
    assert first <= 12 and lengths[-1] >= 8  # drafting within a few plain steps, long drafts after
    assert controller.stats["follows"].switched_off == 0
    assert not any("switched off" in r.getMessage() for r in caplog.records)


def test_a_shadow_counts_the_miss_where_the_generated_text_leaves_the_proposal():
    controller, seq = following(8)
    controller.plan(1, [DraftAsk(seq, list(TEXT[:10]), 16)], 0, 256)
    generated = list(TEXT[:12]) + [7]  # two tokens as proposed, then another
    controller.plan(1, [DraftAsk(seq, generated, 16)], 0, 256)
    own = controller._seqs[seq.key]
    assert own.reached["follows"][:4] == [1, 1, 1, 0]  # kept, kept, missed; the rest never reached
    assert own.kept["follows"][:4] == [1, 1, 0, 0]


def test_a_busy_batch_gets_shorter_drafts_than_a_lone_sequence():
    # a weight-read-bound step: extra tokens are cheap next to a lone token, not next to a full batch
    def plan(n_decoding: int) -> int:
        controller = Controller([Fixed("half", tuple(range(16)))], ControllerConfig(max_draft=16),
                                costs=linear(0.012, 0.004))
        establish(controller, "half", [0.6] * 16, ANY)
        seqs = [DraftSeq(key, key, (), False) for key in range(n_decoding)]
        for s in seqs:
            controller.begin(s)
        plan = controller.plan(n_decoding, [DraftAsk(s, [1], 16) for s in seqs], 0, 256)
        return sum(len(d.tokens) for d in plan.drafts.values())

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


# -- the row budget: the step planned as a whole ------------------------------------------------

class Own:
    """A source drafting for one sequence only, so each sequence's acceptance is set on its own."""

    cost_per_token = 0.0

    def __init__(self, key: int) -> None:
        self.name, self.key = f"s{key}", key

    def begin(self, seq): ...
    def end(self, seq, tokens): ...

    def propose(self, seq, context, k):
        return Draft(tuple(range(k)), self.name) if seq.key == self.key else None


def planned(per_step: float, per_token: float, acceptance: list[float], *, budget: int = 256,
            prefill: int = 0, room: int = 16, left: list[int] | None = None,
            draining: int | None = None, endings: list[tuple[int, int]] = (),
            promised: list[float] | None = None, refill: float = 0.0) -> tuple[list[int], int]:
    """(draft length per sequence, prompt tokens beside them) for sequences whose drafts are kept
    at these rates per position, on a host whose step costs per_step + per_token a row; `left`:
    the tokens each may still generate, `draining` as `Controller.plan` takes it; `endings`:
    earlier sequences, by the tokens they might still have generated when they last asked and
    the tokens they generated from then on (as many: they ran to their max_tokens); `promised`:
    the tokens a step each one's drafts promised at the step before; `refill` as `Controller.plan`
    takes it."""
    costs = CostCurve({n: per_step + per_token * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True)
    controller = Controller([Own(k) for k in range(len(acceptance))], ControllerConfig(max_draft=16), costs=costs)
    for i, (left_then, generated) in enumerate(endings):
        earlier = DraftSeq(1000 + i, 1000 + i, (), False)
        controller.begin(earlier)
        controller.plan(1, [DraftAsk(earlier, [1], left_then - 1, left_then)], 0, budget)
        controller.end(earlier, [1] * (1 + generated))
    seqs = [DraftSeq(k, k, (), False) for k in range(len(acceptance))]
    for seq, p in zip(seqs, acceptance):
        establish(controller, f"s{seq.key}", [p] * 16, ANY)
        controller.begin(seq)
    for seq, promise in zip(seqs, promised or []):
        controller._seqs[seq.key].promise = promise
    lefts = left or [0] * len(seqs)
    plan = controller.plan(len(seqs), [DraftAsk(s, [1], room, n) for s, n in zip(seqs, lefts)], prefill, budget,
                           draining, refill)
    return [len(plan.drafts[s.key].tokens) if s.key in plan.drafts else 0 for s in seqs], plan.prefill


PLANS = [
    # (fixed part, row, acceptance per sequence, budget, prompt tokens waiting) -> (draft lengths, prefill)
    ((0.012, 0.003, [1.0], 256, 0), ([16], 0)),               # every row kept: the whole room
    ((0.012, 0.003, [0.0], 256, 0), ([0], 0)),                # nothing kept: plain decoding
    ((0.012, 0.012, [0.5], 256, 0), ([0], 0)),                # a row costs a step: half a token does not pay
    ((0.012, 0.003, [0.9, 0.3], 256, 0), ([6, 0], 0)),        # the rows go where they are kept
    ((0.012, 0.003, [0.95, 0.8, 0.6, 0.2], 256, 0), ([8, 1, 0, 0], 0)),
    ((0.012, 0.0039, [0.9] * 4, 256, 0), ([3, 3, 3, 3], 0)),  # rows cost more: shorter drafts, evenly
    ((0.012, 0.001, [0.9] * 4, 256, 0), ([6, 6, 6, 6], 0)),   # rows cheap: longer
    ((0.012, 0.003, [1.0] * 4, 10, 0), ([3, 3, 2, 2], 0)),    # a tight budget, spread over the batch
    ((0.012, 0.003, [1.0] * 4, 64, 200), ([8, 8, 8, 8], 32)),  # a long prompt keeps half the budget
    ((0.012, 0.003, [1.0] * 4, 64, 20), ([11, 11, 11, 11], 20)),  # a short one all it needs
]


@pytest.mark.parametrize("given, expected", PLANS)
def test_the_step_plan_gives_rows_to_the_drafts_that_buy_most(given, expected):
    per_step, per_token, acceptance, budget, prefill = given
    assert planned(per_step, per_token, acceptance, budget=budget, prefill=prefill) == expected


def test_a_plan_that_does_not_beat_plain_decoding_verifies_nothing():
    # the first row buys a little more than plain decoding (0.34 tokens for 6 ms, against 1 token
    # for 18 ms) but the step's rate rises less than the margin: the step decodes plainly
    assert planned(0.012, 0.006, [0.34], prefill=8) == ([0], 8)
    # 0.40 tokens for 6 ms: the step's rate rises by 4%, but the row buys tokens only 1.2x as fast
    # as plain decoding, under ROW_MARGIN
    assert planned(0.012, 0.006, [0.40], prefill=8) == ([0], 8)
    assert planned(0.012, 0.006, [0.45], prefill=8) == ([1], 8)


def test_a_promised_pace_counts_only_where_the_plan_drafts_for_it():
    """Four requests started together; at the step before, three promised 3 tokens a step and
    one (key 2) nothing. Counted as they stand, the promises take the three out of the bound and
    every row goes to the fourth (8 rows, none to the others), then to the next one taken for
    the bound, in turn. A promise the plan gives no draft is not a pace: planned again without
    it, the four bound the batch alike, and where one of them cannot draft, nobody's drafts
    shorten it."""
    limits = [(8, 8)] * 16
    promised = [3.0, 3.0, 1.0, 3.0]
    assert planned(0.012, 0.003, [0.9] * 4, left=[24] * 4, draining=0, endings=limits, promised=promised) == \
        planned(0.012, 0.003, [0.9] * 4, left=[24] * 4, draining=0, endings=limits) == ([3, 3, 3, 3], 0)
    assert planned(0.012, 0.003, [0.9, 0.9, 0.9, 0.0], left=[24] * 4, draining=0, endings=limits,
                   promised=promised) == ([0, 0, 0, 0], 0)


def test_the_bound_drafts_as_far_as_the_sequence_next_behind_it():
    """A bound of one shortens the batch only until the sequence next behind it bounds it: its
    kept tokens beyond that count their rows alone."""
    limits = [(8, 8)] * 16
    lengths = [planned(0.012, 0.003, [0.9, 0.9], left=[40, behind], draining=0, endings=limits)[0][0]
               for behind in (10, 36, 38)]
    assert lengths[0] > lengths[1] > lengths[2] > 0


def test_a_bound_with_nothing_behind_it_drafts_to_its_end_whatever_its_drafts_promised():
    """Nothing behind the bound: the batch ends when the bound does, so each token it has left
    shortens the batch, however fast its drafts promise to go. Its steps to go are counted at the
    faster of its pace so far and its promise; its headroom was converted back to tokens at its
    past pace alone, so four requests replaying their answers (drafts promising 16 tokens a step,
    one a step so far) drafted 1 token each of the 13 that would have ended them (3 of 39 with 40
    left), and took a step more at the end of every round."""
    limits = [(8, 8)] * 16
    for promised in ([16.0] * 4, [8.0] * 4, None):
        assert planned(0.006, 0.0014, [0.99] * 4, left=[14] * 4, room=13, draining=0, endings=limits,
                       promised=promised) == ([13] * 4, 0)
        assert planned(0.006, 0.0014, [0.99] * 4, left=[40] * 4, room=16, draining=0, endings=limits,
                       promised=promised)[0] == planned(0.006, 0.0014, [0.99] * 4, left=[40] * 4, room=16)[0]


def test_a_draining_batch_drafts_for_the_sequence_that_bounds_it():
    """Once no request waits to join, the batch lasts as long as its slowest sequence: a token
    kept by a sequence far ahead saves only the row it would have had later, so at 0.9 kept per
    row its drafts do not pay, while the one that bounds the batch drafts more than it would in
    an open batch (each of its kept tokens saves a whole step)."""
    limits = [(8, 8)] * 16  # the sequences before ran to their max_tokens (their last drafts kept whole)
    open_batch = planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], endings=limits)
    assert open_batch[0][0] > 0 and open_batch[0][0] == open_batch[0][1]  # requests wait: alike
    ahead, bound = planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], draining=0, endings=limits)[0]
    assert ahead == 0 and bound > open_batch[0][1]
    # started together, they bound it alike: a token kept by one shortens the batch where the
    # other keeps one too (0.9 here), so each drafts nearly what it would in an open batch
    together, _ = planned(0.012, 0.003, [0.9, 0.9], left=[40, 40], draining=0, endings=limits)
    alike, _ = planned(0.012, 0.003, [0.9, 0.9])
    assert together[0] == together[1] and alike[0] - 1 <= together[0] <= alike[0]
    # a sequence that drafts nothing bounds it: nobody's drafts shorten the batch
    assert planned(0.012, 0.003, [0.9, 0.9, 0.0], left=[40, 40, 40], draining=0, endings=limits) == ([0, 0, 0], 0)
    assert planned(0.012, 0.003, [0.9, 0.9, 0.0])[0][:2] != [0, 0]  # where requests wait, they draft
    # the batch gets shorter by the least the bound keeps: where the weakest draft would not pay
    # alone (an open batch leaves it out), the bound drafts alike, the weakest too
    assert planned(0.012, 0.003, [0.9, 0.9, 0.6])[0] == [4, 4, 0]
    level, _ = planned(0.012, 0.003, [0.9, 0.9, 0.6], left=[40, 40, 40], draining=0, endings=limits)
    assert level[0] == level[1] == level[2] > 0
    # and so with six rows for three drafts: all of the bound draft or none
    tight, _ = planned(0.012, 0.003, [0.9, 0.9, 0.6], left=[40, 40, 40], draining=0, endings=limits, budget=6)
    assert tight[2] > 0 or tight[:2] == [0, 0]
    assert planned(0.012, 0.003, [0.9, 0.9], left=[20, 20], draining=60, endings=limits) == ([0, 0], 0)
    # a lone sequence is its own bound
    assert planned(0.012, 0.003, [0.9], left=[5], draining=0, endings=limits) == planned(0.012, 0.003, [0.9])


def test_where_freed_slots_are_taken_again_at_once_a_draining_batch_drafts_as_an_open_one():
    """Clients that send their next request as each answer comes fill a slot the moment it frees:
    a token kept by the sequence ahead brings its client's next request in sooner, so its drafts
    pay as while requests wait. Where most freed slots were taken, it drafts between."""
    limits = [(8, 8)] * 16
    open_batch = planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], endings=limits)
    assert planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], draining=0, endings=limits, refill=1.0) == open_batch
    ahead = [planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], draining=0, endings=limits, refill=r)[0][0]
             for r in (0.0, 0.75, 1.0)]
    assert ahead[0] == 0 < ahead[1] < ahead[2] == open_batch[0][0]


def draining_batch(kept: Sequence[float], *, spread: dict[int, float] | None = None,
                   voted: bool = False) -> tuple[Controller, list[DraftSeq]]:
    """A controller on the line 12 ms + 3 ms a row (steps of one token per sequence calibrated
    at `spread`, if given) whose earlier sequences ran to their limit, and one sequence per
    entry of `kept` (its own source's drafts kept with that chance at every position), begun;
    `voted`: the sequences are candidates of one Conclave."""
    costs = CostCurve({n: 0.012 + 0.003 * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True)
    if spread is not None:
        costs.spread = spread
    controller = Controller([Own(k) for k in range(len(kept))], ControllerConfig(max_draft=16), costs=costs)
    ran_to_their_limit(controller)
    seqs = [DraftSeq(k, 7 if voted else k, (), False, voted=voted) for k in range(len(kept))]
    for seq, p in zip(seqs, kept):
        establish(controller, f"s{seq.key}", [p] * 16, ANY)
        controller.begin(seq)
    return controller, seqs


def ran_to_their_limit(controller: Controller, n: int = 16) -> None:
    """n earlier sequences that each generated all they had left at their last ask (their
    max_tokens was their end), so the planner takes what a sequence has left to bound it."""
    for i in range(n):
        earlier = DraftSeq(1000 + i, 1000 + i, (), False)
        controller.begin(earlier)
        controller.plan(1, [DraftAsk(earlier, [1], 7, 8)], 0, 256)
        controller.end(earlier, [1] * 9)


def test_a_sequence_that_has_just_begun_to_draft_is_counted_at_the_pace_its_drafts_promise():
    """Four requests started together on a past answer: two kept an 11-token draft in the step
    before, the other two (still in their prompts then) have one token each. At their pace so
    far (one token a step) the two behind seemed to bound the batch for 47 steps, and the rows
    went to them alone, then to the other two in turn; at the pace their drafts promise all four
    finish within a step of each other, so all four draft."""
    controller = Controller([Fixed("s0", tuple(range(16)))], ControllerConfig(max_draft=16),
                            costs=CostCurve({n: 0.0206 + 0.0037 * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True))
    establish(controller, "s0", [0.98] * 16, ANY)
    ran_to_their_limit(controller)
    seqs = [DraftSeq(k, k, (), False) for k in range(4)]
    for seq in seqs:
        controller.begin(seq)
    prompt = [1] * 20
    controller.plan(4, [DraftAsk(s, prompt, 16, 48) for s in seqs[:2]] +
                    [DraftAsk(s, prompt, 16, 48) for s in seqs[2:]], 0, 256, 48)
    ahead = [DraftAsk(s, prompt + [1] * 12, 16, 36) for s in seqs[:2]]
    behind = [DraftAsk(s, prompt + [1], 16, 47) for s in seqs[2:]]
    plan = controller.plan(4, ahead + behind, 0, 256, 0)
    assert sorted(plan.drafts) == [0, 1, 2, 3]


def test_a_bound_sequence_that_kept_pace_so_far_holds_nobody_back_in_a_step_without_a_draft():
    """Three requests started together; the third has no draft this step. If it kept 2 tokens a
    step so far (its drafts will be back), it keeps pace over the run and the others draft as
    usual; if it never kept one (prose), their kept tokens would not shorten the batch."""
    def plan(kept_a_step: float) -> list[int]:
        controller, seqs = draining_batch((0.9, 0.9, 0.0))
        context = [1] * 30  # 30 tokens since each first asked: a step each for the first two
        for seq in seqs:
            own = controller._seqs[seq.key]
            own.start, own.asked = 0, round(len(context) / (1 + (kept_a_step if seq.key == 2 else 0.0))) - 1
        lefts = [40, 40, round(40 * (1 + kept_a_step))]  # the same steps to go for each
        asks = [DraftAsk(seq, context, 16, left) for seq, left in zip(seqs, lefts)]
        drafts = controller.plan(3, asks, 0, 256, 0).drafts
        return [len(drafts[s.key].tokens) if s.key in drafts else 0 for s in seqs]

    assert plan(0.0) == [0, 0, 0]
    paced = plan(2.0)
    assert paced[0] > 0 and paced[1] > 0 and paced[2] == 0


def test_where_sequences_stop_at_their_end_of_text_what_they_have_left_bounds_nothing():
    """A chat asking for 512 tokens may stop after 50: when the sequences before stopped well
    short of their max_tokens, the one with less left is not taken to finish first."""
    stopped = [(400, 1)] * 16
    open_batch = planned(0.012, 0.003, [0.9, 0.9], left=[10, 40])
    ahead, bound = planned(0.012, 0.003, [0.9, 0.9], left=[10, 40], draining=0, endings=stopped)[0]
    assert ahead > 0 and ahead >= open_batch[0][0] - 1 and bound <= open_batch[0][1] + 1


def test_sampled_acceptance_is_learned_apart_from_greedy():
    controller = Controller([Fixed("src", tuple(range(8)))], ControllerConfig(max_draft=8), costs=linear())
    greedy, sampled = DraftSeq(1, 1, (), False), DraftSeq(2, 2, (), True)
    for seq in (greedy, sampled):
        controller.begin(seq)
    for _ in range(40):
        controller.verified(greedy, Draft(tuple(range(8)), "src"), 8)
        controller.verified(sampled, Draft(tuple(range(8)), "src"), 0)
    state = controller.state()["src"]
    assert min(state["acceptance_by_position"]) > 0.9 and state["sampled_acceptance_by_position"][0] < 0.1
    fresh_greedy, fresh_sampled = DraftSeq(3, 3, (), False), DraftSeq(4, 4, (), True)
    for seq in (fresh_greedy, fresh_sampled):
        controller.begin(seq)
    plan = controller.plan(2, [DraftAsk(fresh_greedy, [1], 8), DraftAsk(fresh_sampled, [1], 8)], 0, 256)
    assert len(plan.drafts[3].tokens) == 8 and 4 not in plan.drafts


def test_a_long_match_is_trusted_apart_from_a_short_one():
    source = Matching("src", tuple(range(16)))
    controller = Controller([source], ControllerConfig(max_draft=16), costs=linear(0.012, 0.003))
    seq = DraftSeq(1, 1, (), False)
    teacher = DraftSeq(9, 9, (), False)
    controller.begin(teacher)
    for _ in range(60):  # long matches are kept whole, 2-token matches never
        controller.verified(teacher, Draft(tuple(range(16)), "src", match=24), 16)
        controller.verified(teacher, Draft(tuple(range(16)), "src", match=2), 0)
    controller.begin(seq)
    lengths = {}
    for match in (24, 2):
        source.match = match
        plan = controller.plan(1, [DraftAsk(seq, [1], 16)], 0, 256)
        lengths[match] = len(plan.drafts[1].tokens) if 1 in plan.drafts else 0
    assert lengths == {24: 16, 2: 0}


def test_an_echo_is_judged_apart_from_a_quote_of_the_same_length():
    """Quotes of the prompt matched on 2 tokens were kept whole, echoes of the sequence's own
    output matched on 2 tokens never: a quote drafts long, an echo nothing."""
    source = Matching("src", tuple(range(16)))
    source.match = 2
    controller = Controller([source], ControllerConfig(max_draft=16), costs=linear(0.012, 0.003))
    teacher = DraftSeq(9, 9, (), False)
    controller.begin(teacher)
    for _ in range(60):
        controller.verified(teacher, Draft(tuple(range(16)), "src", match=2), 16)
        controller.verified(teacher, Draft(tuple(range(16)), "src", match=2, echo=True), 0)
    seq = DraftSeq(1, 1, (), False)
    controller.begin(seq)
    lengths = {}
    for echo in (False, True):
        source.echo = echo
        plan = controller.plan(1, [DraftAsk(seq, [1], 16)], 0, 256)
        lengths[echo] = len(plan.drafts[1].tokens) if 1 in plan.drafts else 0
    assert lengths == {False: 16, True: 0}


def test_a_fresh_node_drafts_a_long_match_long_at_once_and_a_short_one_short():
    """No draft judged yet: a 24-token match starts from what the run says (node/speculative/
    controller.py `_run_prior`) and drafts every position at once; a 2-token match, and any
    match of a sampled sequence, start from the source's prior and draft a few."""
    lengths = {}
    for match, sampled in ((24, False), (9, False), (2, False), (24, True)):
        source = Matching("src", tuple(range(16)))
        source.match = match
        controller = Controller([source], ControllerConfig(max_draft=16), costs=linear())
        seq = DraftSeq(1, 1, (), sampled)
        controller.begin(seq)
        plan = controller.plan(1, [DraftAsk(seq, [1], 16)], 0, 256)
        lengths[(match, sampled)] = len(plan.drafts[1].tokens) if 1 in plan.drafts else 0
    assert lengths[(24, False)] == 16 and lengths[(9, False)] >= 12
    assert 0 < lengths[(2, False)] <= 4 and 0 < lengths[(24, True)] <= 4


def test_a_replay_is_drafted_long_where_long_matches_have_been_kept_a_little_less():
    """Four sequences in a step, each with a 16-token draft of a 32-token match, where such
    matches were kept at 0.96 a position (a paragraph quoted under other prompts parts from the
    text now and then): the plan verifies short drafts. The same drafts as replays (a past
    answer to the same prompt, node/speculative/palimpsest.py) start from their own estimates
    and are verified at far greater length: the second sight of an answer is drafted whole."""
    rows = {}
    for replay in (False, True):
        source = Matching("src", tuple(range(16)))
        source.match, source.replay = 32, replay
        controller = Controller([source], ControllerConfig(max_draft=16, n_parallel=4), costs=linear())
        establish(controller, "src", [0.96] * 16)
        establish(controller, "src", [0.96] * 16, match_class=4)
        seqs = [DraftSeq(key, key, (1, 2, 3), False) for key in range(1, 5)]
        for s in seqs:
            controller.begin(s)
        plan = controller.plan(4, [DraftAsk(s, [1, 2, 3], 16) for s in seqs], 0, 256)
        rows[replay] = sum(len(d.tokens) for d in plan.drafts.values())
    assert rows[True] >= 48 and rows[True] >= 1.5 * rows[False], rows


def test_a_seeded_sampled_sequence_drafts_a_replay_as_long_as_a_greedy_one():
    """Sampled drafts have been kept half the time (the sampled estimates), greedy ones 0.96 a
    position. A replay (a past answer to the same prompt) for a sequence whose draws are keyed
    by its seed comes back token for token where it was drawn with that seed, so its first
    replay is verified whole, as a greedy sequence's is; an unseeded sampled sequence keeps a
    replayed token only with its probability, and its replay stays short."""
    lengths = {}
    for name, sampling in (("greedy", SamplingParams(temperature=0.0)),
                           ("seeded", SamplingParams(temperature=0.8, seed=11)),
                           ("unseeded", SamplingParams(temperature=0.8))):
        source = Matching("src", tuple(range(16)))
        source.match, source.replay = 64, True
        controller = Controller([source], ControllerConfig(max_draft=16, n_parallel=1), costs=linear())
        establish(controller, "src", [0.96] * 16)
        state = controller._sources["src"]
        state.p[(True, ANY)], state.seen[(True, ANY)] = [0.5] * 16, [1000] * 16
        seq = DraftSeq(1, 1, (1, 2, 3), not sampling.greedy, sampling, seed=sampling.seed)
        controller.begin(seq)
        plan = controller.plan(1, [DraftAsk(seq, [1, 2, 3], 16)], 0, 256)
        lengths[name] = len(plan.drafts[1].tokens) if 1 in plan.drafts else 0
    assert lengths["greedy"] == 16 and lengths["seeded"] == 16, lengths
    assert lengths["unseeded"] <= 2, lengths


def test_a_long_match_that_is_not_kept_loses_its_head_start():
    """The run's estimates are a start, not a floor: a class of long matches whose drafts are
    rejected learns to draft little."""
    source = Matching("src", tuple(range(16)))
    source.match = 24
    controller = Controller([source], ControllerConfig(max_draft=16), costs=linear())
    lengths = run(controller, 60, lambda n: 0)
    assert lengths[0] == 16 and sum(lengths[-30:]) <= 6


def test_a_first_sampled_sequence_starts_from_what_greedy_ones_taught():
    controller = Controller([Fixed("src", tuple(range(8)))], ControllerConfig(max_draft=8), costs=linear())
    teacher = DraftSeq(1, 1, (), False)
    controller.begin(teacher)
    for _ in range(40):
        controller.verified(teacher, Draft(tuple(range(8)), "src"), 8)
    sampled = DraftSeq(2, 2, (), True)
    controller.begin(sampled)
    plan = controller.plan(1, [DraftAsk(sampled, [1], 8)], 0, 256)
    assert len(plan.drafts[2].tokens) == 8  # not the prior's short first draft
    controller.verified(sampled, plan.drafts[2], 0)
    assert controller.state()["src"]["sampled_acceptance_by_position"][0] < \
        controller.state()["src"]["acceptance_by_position"][0]  # from then on its own evidence


def test_a_source_outbid_by_another_that_still_pays_stays_on():
    # both sources' drafts are kept whole; the longer one wins each step, the other still pays
    long, short = Fixed("long", tuple(range(8))), Fixed("short", tuple(range(3)))
    controller = Controller([long, short], ControllerConfig(max_draft=8), costs=linear())
    run(controller, SWITCH_OFF * 3, lambda n: n)
    assert controller.state()["short"]["on"] and controller.stats["short"].switched_off == 0


def test_the_token_after_a_draft_and_the_next_token_of_an_undrafted_sequence_are_hints():
    """A free source is asked for one token more than the room; the token after the verified
    draft is its hint (`Draft.after`), for the row after the draft's last; a sequence whose
    draft does not pay decodes one row, with its proposal's first token as the hint."""
    source = Fixed("src", tuple(range(100, 120)))
    costs = CostCurve({n: 0.012 + 0.003 * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True)
    controller = Controller([source], ControllerConfig(max_draft=16), costs=costs)
    seq = DraftSeq(1, 1, (), False)
    controller.begin(seq)
    establish(controller, "src", [0.9] * 16, ANY)
    plan = controller.plan(1, [DraftAsk(seq, [1], 4)], 0, 256)
    assert source.asked[-1] == 5
    assert plan.drafts[1].tokens == (100, 101, 102, 103) and plan.drafts[1].after == 104 and not plan.hints
    establish(controller, "src", [0.9] + [0.0] * 15, ANY)
    plan = controller.plan(1, [DraftAsk(seq, [1], 16)], 0, 256)
    assert plan.drafts[1].tokens == (100,) and plan.drafts[1].after == 101  # cut where it stops paying
    establish(controller, "src", [0.05] * 16, ANY)
    plan = controller.plan(1, [DraftAsk(seq, [1], 16)], 0, 256)
    assert not plan.drafts and plan.hints == {1: 100}


def test_a_draft_cut_by_the_grammar_carries_no_hint():
    class Upto:
        def __init__(self, n: int) -> None:
            self.n = n

        def forced(self):
            return []

        def valid(self, tokens):
            return min(self.n, len(tokens))

    source = Fixed("src", tuple(range(100, 120)))
    costs = CostCurve({n: 0.012 + 0.003 * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True)
    controller = Controller([source], ControllerConfig(max_draft=16), costs=costs)
    seq = DraftSeq(1, 1, (), False, grammar=Upto(3))
    controller.begin(seq)
    establish(controller, "src", [1.0] * 16, ANY)
    plan = controller.plan(1, [DraftAsk(seq, [1], 8)], 0, 256)
    assert plan.drafts[1].tokens == (100, 101, 102) and plan.drafts[1].after is None


def test_structured_output_drafts_stop_before_a_sentence_ends():
    class Any_:
        def forced(self):
            return []

        def valid(self, tokens):
            return len(tokens)

    # 100 " 960", 101 " 118", 102 ".", 103 " Her", 104 " manager"; 105 "maria", 102 ".", 106 "ke"
    pieces = {100: b" 960", 101: b" 118", 102: b".", 103: b" Her", 104: b" manager", 105: b"maria", 106: b"ke",
              107: b"ane"}
    costs = CostCurve({n: 0.012 + 0.003 * n for n in (1, 2, 4, 8, 16, 32, 68)}, fixed=True)

    def planned(tokens: tuple[int, ...], grammar) -> tuple[int, ...] | None:
        source = Fixed("src", tokens)
        controller = Controller([source], ControllerConfig(max_draft=16), costs=costs)
        controller.bind_vocabulary(lambda token: pieces[token], lambda text: [])
        seq = DraftSeq(1, 1, (), False, grammar=grammar)
        controller.begin(seq)
        establish(controller, "src", [1.0] * 16, ANY)
        draft = controller.plan(1, [DraftAsk(seq, [1], 8)], 0, 256).drafts.get(1)
        return None if draft is None else draft.tokens

    assert planned((100, 101, 102, 103, 104), Any_()) == (100, 101)  # "960 118" and not ". Her manager"
    assert planned((102, 103, 104), Any_()) is None  # the value ends here: nothing to draft
    assert planned((105, 102, 106, 107), Any_()) == (105, 102, 106, 107)  # "maria.keane": a dot inside a value
    assert planned((100, 101, 102, 103, 104), None) == (100, 101, 102, 103, 104)  # free text: a sentence goes on


def test_the_calibrated_curve_is_kept_for_the_next_start_and_a_bad_file_is_measured_again(tmp_path, caplog):
    path = tmp_path / "kernels" / "costs-x.json"
    store = CostStore(path)
    staircase = lambda n_seqs, k: 0.018 + 0.0034 * n_seqs * (k + 1) + (0.012 if n_seqs * (k + 1) % 4 and n_seqs * (k + 1) > 4 else 0)  # noqa: E731
    first = Controller([], ControllerConfig(max_draft=16, n_parallel=4), store=store)
    assert not first.costs.measured and first.calibration_due()  # nothing kept: measure when idle
    first.calibrate(staircase)
    assert first.costs.measured and path.exists() and not first.calibration_due()
    again = Controller([], ControllerConfig(max_draft=16, n_parallel=4), store=store)
    assert again.costs.measured and again.costs.plain_rate() is not None and not again.calibration_due()
    for n in (1, 4, 5, 8, 9, 12):  # the staircase as measured, from the first plan on
        assert abs(again.costs.seconds(n) - first.costs.seconds(n)) < 1e-9
    assert again.costs.seconds(5) > again.costs.seconds(8)
    for damage in (b"{not json", b'{"layout": 1, "points": {"4": -1}}', b'{"layout": 99, "points": {"4": 0.03}}'):
        path.write_bytes(damage)
        assert not Controller([], store=store).costs.measured  # measured again, not trusted
    blocked = tmp_path / "home-file"
    blocked.write_text("a file where the home's directory should be")  # a home that cannot be written
    unwritable = CostStore(blocked / "kernels" / "costs-x.json")
    with caplog.at_level("WARNING"):
        Controller([], ControllerConfig(max_draft=16, n_parallel=4), store=unwritable).calibrate(staircase)
    assert "could not keep it" in caplog.text  # and the node measures again at its next start
    assert not Controller([], store=unwritable).costs.measured


def test_a_curve_never_measured_is_due_when_idle_and_backs_off_while_calibrations_give_way():
    curve = CostCurve()
    controller = Controller([], costs=curve)
    assert controller.calibration_due()
    curve.calibrate(lambda n_seqs, k: None, n_parallel=4, max_draft=16)  # a request was waiting
    assert not curve.measured and not controller.calibration_due()  # not again at once
    curve._calibrated_at -= costs_module.RECALIBRATE_MIN_S * 2 + 1  # the backoff (doubled) has passed
    assert controller.calibration_due()
    assert not Controller([], costs=CostCurve(fixed=True)).calibration_due()


def test_a_fresh_estimate_is_the_mean_of_what_it_saw_then_a_moving_average():
    """An estimate's start counts PRIOR_COUNT observations: its first drafts move it to the mean of
    what they showed (a fixed moving average would still weigh the start as ten), and once it has
    seen many, one more moves it by EMA."""
    controller = Controller([Fixed("new", tuple(range(16)))], ControllerConfig(max_draft=16), costs=linear())
    controller.begin(SEQ)
    for _ in range(5):
        controller.verified(SEQ, Draft((0, 1), "new"), 2)
    p = controller._sources["new"].p[(False, ANY)]
    assert p[0] == pytest.approx((5 + PRIOR_COUNT * PRIOR) / (5 + PRIOR_COUNT))  # 0.857; by EMA alone 0.705
    assert p[2] == pytest.approx((5 + PRIOR_COUNT * PRIOR) / (5 + PRIOR_COUNT))  # the position after a kept draft
    for _ in range(100):
        controller.verified(SEQ, Draft((0,), "new"), 0)
    before = p[0]
    controller.verified(SEQ, Draft((0,), "new"), 1)
    assert p[0] == pytest.approx(before + EMA * (1.0 - before))



def test_a_vote_s_candidates_draft_though_the_slowest_would_hold_the_batch():
    """Two candidates of one Conclave, 40 tokens left each: one writes what nothing drafts, the
    other copies, its drafts kept 90% of the time. Bound by its slowest, the batch would not
    end sooner for the copy's kept tokens (worth their rows alone: it waits); but the vote may
    end the Conclave when the copy ends, so a candidate (`voted`) drafts as in an open batch."""
    def plan(voted: bool) -> list[int]:
        controller, seqs = draining_batch((0.0, 0.9), voted=voted)
        drafts = controller.plan(2, [DraftAsk(seq, [1] * 30, 16, 40) for seq in seqs], 0, 256, 0).drafts
        return [len(drafts[s.key].tokens) if s.key in drafts else 0 for s in seqs]

    held, racing = plan(False), plan(True)
    assert racing[0] == 0 and racing[1] > held[1]


def test_beside_other_users_a_vote_s_candidates_neither_bound_the_batch_nor_wait():
    """A user's sequence with 40 tokens left beside two candidates of a Conclave with 47: the
    user bounds the batch (its kept tokens shorten it), the candidates are left out of the bound
    and each kept token of theirs is worth a plain token."""
    user = DraftSeq(1, 1, (), False)
    candidates = [DraftSeq(k, 9, (), False, voted=True) for k in (2, 3)]
    asks = [DraftAsk(user, [1], 16, 40)] + [DraftAsk(c, [1], 16, 47) for c in candidates]
    drain = Draining.of(asks, 0, 3, 0.003, 3 / 0.021, {1: 1.0, 2: 1.0, 3: 1.0}, 1.0)
    assert drain is not None and drain.bound == frozenset({1})
    assert drain.worth(2) == drain.worth(3) == 1.0 and drain.worth(1) > 1.0


def test_a_sequence_ending_before_the_bound_is_worth_the_step_its_end_sheds():
    """Two sequences, none waiting: one copies (90% kept) with 8 tokens left, the other writes
    what nothing drafts with 40 and bounds the batch. The copy's kept tokens only end it sooner,
    and what that saves is the step of two sequences against one, as calibrated (`spread`).
    Where the kernels make a lone sequence's step 10 ms cheaper than two's (the line's slope
    says 3 ms), ending the copy early pays and it drafts; where one sequence fewer saves 1 ms
    (4-row tiles) or the slope's 3 ms, its rows buy nothing and it drafts nothing."""
    def plan(spread: dict[int, float]) -> int:
        controller, seqs = draining_batch((0.9, 0.0), spread=spread)
        asks = [DraftAsk(seqs[0], [1] * 30, 16, 8), DraftAsk(seqs[1], [1] * 30, 16, 40)]
        drafts = controller.plan(2, asks, 0, 256, 0).drafts
        assert seqs[1].key not in drafts
        return len(drafts[0].tokens) if 0 in drafts else 0

    assert plan({1: 0.010, 2: 0.020}) > 0
    assert plan({1: 0.015, 2: 0.016}) == 0
    assert plan({}) == 0  # not calibrated: a row on the line


def test_a_sequence_ending_before_the_bound_sheds_the_step_of_those_still_running_at_its_end():
    """Three sequences, none waiting: one writes what nothing drafts with 40 tokens left and
    bounds the batch; two copy (90% kept), one with 24 left, one with 8. The one with 8 ends
    first, at a step of all three, which costs 1 ms more than one of two: its rows buy nothing.
    The one with 24 ends at a step of two, 10 ms dearer than the bound's lone steps after it:
    it drafts. Priced at the step of three both would draft nothing."""
    controller, seqs = draining_batch((0.0, 0.9, 0.9), spread={1: 0.010, 2: 0.020, 3: 0.021})
    asks = [DraftAsk(seqs[0], [1] * 30, 16, 40), DraftAsk(seqs[1], [1] * 30, 16, 24),
            DraftAsk(seqs[2], [1] * 30, 16, 8)]
    drafts = controller.plan(3, asks, 0, 256, 0).drafts
    assert 0 not in drafts and 2 not in drafts
    assert len(drafts[1].tokens) > 0


def test_the_calibration_measures_what_a_step_sheds_with_one_sequence_fewer(tmp_path):
    """Steps of k sequences with one token each are measured beside the sizes; `shed_seconds`
    reads them (the line's row before they are), and the next start gets them from the store."""
    def measure(n_seqs: int, k: int) -> float:
        rows = n_seqs * (k + 1)
        tiles = -(-rows // 4)  # kernels working in tiles of 4 rows
        return 0.010 + 0.012 * tiles + 0.0005 * rows + (0.0 if n_seqs == 1 and k == 0 else 0.004)

    curve = CostCurve()
    assert curve.shed_seconds(4) == curve.row_seconds()
    store = CostStore(tmp_path / "costs.json")
    controller = Controller([], ControllerConfig(max_draft=16, n_parallel=4), costs=curve, store=store)
    controller.calibrate(measure)
    assert sorted(curve.spread) == [1, 2, 3, 4]
    assert curve.shed_seconds(4) == pytest.approx(0.0005 * curve.scale)  # 4 rows in one tile as 3
    assert curve.shed_seconds(2) == pytest.approx(0.0045 * curve.scale)  # a lone sequence's step is cheaper
    assert curve.shed_seconds(5) == curve.row_seconds()  # not measured
    again = Controller([], ControllerConfig(max_draft=16, n_parallel=4), store=store)
    assert again.costs.spread == curve.spread
    (tmp_path / "old.json").write_bytes(b'{"layout": 1, "points": {"1": 0.02, "2": 0.025, "4": 0.03}}')
    kept = Controller([], store=CostStore(tmp_path / "old.json")).costs  # kept before spreads were measured
    assert kept.measured and kept.spread == {} and kept.shed_seconds(4) == kept.row_seconds()
    assert kept.context == {} and kept.context_seconds(2048) == 0.0  # nor the rows' cost after a context


def _context_host(per_row_after: dict[int, float]):
    """measure and attend of a host whose rows cost 1 ms each plus `per_row_after` (context -> a
    row's extra seconds) after so many tokens of context, and a step 10 ms."""
    def measure(n_seqs, k):
        return 0.010 + 0.001 * n_seqs * (k + 1)

    def attend(context, k):
        return 0.010 + (0.001 + per_row_after.get(context, 0.0)) * (k + 1)
    return measure, attend


def test_a_row_s_cost_after_its_context_is_calibrated_interpolated_and_kept_between_starts(tmp_path):
    measure, attend = _context_host({128: 0.0004, 512: 0.0008, 1024: 0.0009})
    curve = CostCurve()
    curve.calibrate(measure, n_parallel=4, max_draft=16, attend=attend)
    assert curve.context == pytest.approx({128: 0.0004, 512: 0.0008, 1024: 0.0009})
    assert curve.context_seconds(0) == 0.0 and curve.context_seconds(64) == pytest.approx(0.0002)
    assert curve.context_seconds(320) == pytest.approx(0.0006)  # halfway between 128 and 512
    assert curve.context_seconds(2048) == pytest.approx(0.0011)  # past the last point, along the last stretch
    assert "a row after so many tokens of context: 128 +0.40 ms" in curve.describe()
    # a noisy point below a shorter context's is raised to it: a longer context never reads less
    noisy = CostCurve()
    noisy_measure, noisy_attend = _context_host({128: 0.0004, 512: 0.0003, 1024: 0.0009})
    noisy.calibrate(noisy_measure, n_parallel=4, max_draft=16, attend=noisy_attend)
    assert noisy.context[512] == pytest.approx(0.0004)
    # a context that gives way (a request waits) keeps the points before it
    short = CostCurve()
    short.calibrate(measure, n_parallel=4, max_draft=16,
                    attend=lambda context, k: None if context >= 512 else attend(context, k))
    assert set(short.context) == {128}
    budget = costs_module.CONTEXT_BUDGET_S
    try:  # once the budget is spent, no further context: the first point only
        costs_module.CONTEXT_BUDGET_S = 0.0
        hurried = CostCurve()
        hurried.calibrate(measure, n_parallel=4, max_draft=16, attend=attend)
        assert hurried.context == pytest.approx({128: 0.0004})
        assert hurried.context_seconds(512) == pytest.approx(0.0016)  # along the stretch from none to 128
    finally:
        costs_module.CONTEXT_BUDGET_S = budget
    single = CostCurve()  # one slot: the empty context measured first, apart
    single.calibrate(measure, n_parallel=1, max_draft=16, attend=attend)
    assert single.context == pytest.approx(curve.context)
    store = CostStore(tmp_path / "costs.json")
    store.save(curve.points, curve.spread, curve.context)
    restored = CostCurve()
    restored.restore(*store.load())
    assert restored.context == pytest.approx(curve.context)
    assert restored.context_seconds(320) == pytest.approx(0.0006)
    # a file whose context says a row costs less than nothing, or a minute more, is not used
    (tmp_path / "bad.json").write_bytes(b'{"layout": 1, "points": {"1": 0.02, "2": 0.025, "4": 0.03}, '
                                        b'"context": {"512": -0.001}}')
    assert CostStore(tmp_path / "bad.json").load() is None


def test_an_observed_step_s_attention_is_taken_out_so_the_line_stays_the_empty_cache_s():
    curve = linear()
    for _ in range(300):  # 8 rows after their contexts, each 0.5 ms more than on the line
        curve.observe(8, curve.seconds(8) + 8 * 0.0005, attention=8 * 0.0005)
    assert curve.scale == pytest.approx(1.0, abs=1e-6)
    for _ in range(300):  # the same steps, their attention not said: the whole line seems slower
        curve.observe(8, curve.seconds(8) / curve.scale + 8 * 0.0005)
    assert curve.scale > 1.15


def test_drafts_deep_in_a_long_context_pay_for_their_rows_attention():
    """The same drafts (each position kept 0.75 of the time) of four sequences, priced by their
    context: each row costs the line's 1.2 ms and what it costs more after 1,024 tokens of context.
    The decoding rows pay that too, so plain steps cost more as well; still, the more a row's
    attention costs, the shorter the drafts, down to none."""
    def planned(context: int, extra: float) -> list[int]:
        curve = linear()
        curve.context = {1024: extra}
        controller = Controller([Fixed("f", tuple(range(16)))], ControllerConfig(max_draft=16, n_parallel=4),
                                costs=curve)
        establish(controller, "f", [0.75] * 16)
        seqs = [DraftSeq(k, k, (1, 2, 3), False) for k in range(4)]
        for s in seqs:
            controller.begin(s)
        plan = controller.plan(4, [DraftAsk(s, [1] * context, 16) for s in seqs], 0, 256)
        return [len(plan.drafts[s.key].tokens) if s.key in plan.drafts else 0 for s in seqs]

    assert planned(1024, 0.0) == [3] * 4
    assert planned(0, 0.004) == [3] * 4  # no context: nothing more to pay
    assert planned(1024, 0.001) == [2] * 4
    assert planned(1024, 0.002) == [1] * 4
    assert planned(1024, 0.004) == [0] * 4


def test_a_row_s_cost_after_a_context_is_measured_beside_the_same_rows_without_one():
    """Something else starts working on the host once the empty context has been measured (a
    starting node's other parts): every decode from then on takes a fifth longer. Each decode
    after a context beside one of a sequence of its own, the difference grows by that fifth
    only; against the empty context timed before, it takes the whole step's slowdown."""
    def measure(n_seqs, k):
        return 0.010 + 0.001 * n_seqs * (k + 1)

    def host(slow_after: int):
        calls = []

        def attend(context, k):
            calls.append(context)
            slower = 1.2 if len(calls) > slow_after else 1.0
            return (0.010 + (0.001 + {128: 0.0004, 512: 0.0008, 1024: 0.0009}.get(context, 0.0)) * (k + 1)) * slower
        return attend

    paired = CostCurve()
    paired.calibrate(measure, n_parallel=4, max_draft=16, attend=host(1))
    assert paired.context == pytest.approx({128: 0.00048, 512: 0.00096, 1024: 0.00108})
    apart = CostCurve()  # one slot: the empty context measured first (a warm-up and REPEATS decodes)
    apart.calibrate(measure, n_parallel=1, max_draft=16, attend=host(1 + costs_module.REPEATS))
    assert apart.context[128] > 0.00075  # 0.8 ms against 0.4: the empty context taken at full speed
