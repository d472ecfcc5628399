"""Speculation on the real model: the node's controller and sources in the engine, output
compared with speculation off in every combination (prefix cache restore, interleaved
users, n > 1), and the sampled output distribution with and without drafts.

Greedy comparisons run in one engine, speculation on against off (the per-request flag),
never across builds: the base model has many near-ties. Verifying drafts puts several of a
sequence's tokens in one ubatch and changes the batch's shape for the other users, and
llama.cpp's CPU kernels are not batch-invariant (tests/node/engine/test_engine_batching.py):
where interleaving is involved, text must be identical up to the first near-tie of the
plain run (top-2 gap under NEAR_TIE), so a real verification error (a divergence at a clear
margin) fails.
"""

from __future__ import annotations

import collections
import time

import pytest

from node.engine.engine import Engine, EngineConfig
from node.engine.types import GenerationRequest, SamplingParams
from node.speculative.controller import Controller, ControllerConfig
from node.speculative.costs import CostCurve
from node.speculative.lookup import PromptLookup
from node.speculative.palimpsest import Palimpsest
from tests.node.engine.test_engine_hooks import DictPrefixCache
from tests.node.near_ties import assert_same_up_to_near_ties, first_parting, reference_of

pytestmark = pytest.mark.model
GREEDY = SamplingParams(temperature=0.0)
REPEATS = ("Copy the list exactly.\nList: red apple, green pear, yellow lemon, purple plum, orange peach.\n"
           "Copy: red apple, green pear,")
PROSE = "The history of the old mill by the river begins"


@pytest.fixture(scope="module")
def spec(gemma_path):
    # a fixed, cheap cost line (drafts nearly free): the controller's choices must not depend on the
    # load, and every draft with a fair chance is verified, four users or one
    costs = CostCurve({1: 0.0126, 8: 0.0150}, fixed=True)
    controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=8, n_parallel=4), costs=costs)
    cache = DictPrefixCache()
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=4096, n_parallel=4, max_draft=8, speculator=controller,
                              prefix_cache=cache, step_token_budget=64,
                              resident_prefixes=False))  # the prefix cache tier, not a kept slot, must answer
    yield eng, controller, cache
    eng.close()


def run(eng: Engine, text: str, n_tokens: int = 32, *, speculation: bool = True, sampling=GREEDY, n: int = 1):
    return [events[-1] for events in run_events(eng, text, n_tokens, speculation=speculation, sampling=sampling, n=n)]


def run_events(eng: Engine, text: str, n_tokens: int = 32, *, speculation: bool = True, sampling=GREEDY,
               n: int = 1, logprobs: int | None = None):
    req = GenerationRequest(tuple(eng.tokenize(text)), max_tokens=n_tokens, sampling=sampling,
                            speculation=speculation, logprobs=logprobs)
    handles = eng.submit_n(req, n)
    return [list(h.iter_sync(timeout=300)) for h in handles]


def assert_same_distribution(tally: dict[bool, collections.Counter], firsts: dict[bool, collections.Counter],
                             n: int, tv_bound: float) -> None:
    """Speculation on (True) against off (False), n samples each: total variation of the first
    tokens' joint distribution under tv_bound, and a chi-square test of the first token."""
    tv = 0.5 * sum(abs(tally[True][k] - tally[False][k]) for k in tally[True] | tally[False]) / n
    assert tv < tv_bound, (tally[True].most_common(5), tally[False].most_common(5))
    chi2, dof = 0.0, -1
    for k in firsts[True] | firsts[False]:
        a, b = firsts[True][k], firsts[False][k]
        if a + b >= 5:
            chi2 += (a - b) ** 2 / (a + b)
            dof += 1
    assert dof >= 1 and chi2 < 3 * max(dof, 1) + 10, (chi2, dof)


def test_greedy_output_is_the_same_with_and_without_speculation(spec):
    eng, controller, _ = spec
    before = eng.stats()["draft_accepted"]
    for text in (REPEATS, PROSE):
        # a verify step's rows are not bit-identical to one-token steps on every host (on one with
        # repacked weights a 5-row step moves the top-2 gap by up to 0.17 nats): the same up to near-ties
        off = run_events(eng, text, speculation=False, logprobs=2)[0]
        on = run(eng, text)[0]
        assert_same_up_to_near_ties(reference_of(off), on)
    assert eng.stats()["draft_accepted"] > before  # the copy task kept drafts
    assert controller.stats["lookup"].accepted > 0


def test_the_same_request_again_drafts_from_the_palimpsest(spec):
    eng, controller, _ = spec
    text = "Write a short note to the harbour master about the late ferry."
    plain = run_events(eng, text, 40, speculation=False, logprobs=2)[0]
    first = run(eng, text, 40)[0]
    kept = {name: controller.stats[name].accepted for name in ("archive", "lookup")}
    second = run(eng, text, 40)[0]
    assert_same_up_to_near_ties(reference_of(plain), first)
    assert_same_up_to_near_ties(reference_of(plain), second)
    gained = {name: controller.stats[name].accepted - kept[name] for name in kept}
    parted = first_parting(first.generated, second.generated)
    if parted is None:
        # where the answer loops (the base model does on some hosts' kernels), prompt lookup's draft
        # of the loop can be worth as much as the stored answer's: the two together keep most of the
        # answer, the Palimpsest some of it
        assert gained["archive"] > 0 and sum(gained.values()) >= len(second.generated) // 2, gained
    else:
        # the second answer left the stored one at a near-tie (checked above against plain decoding:
        # its verify rows, computed in steps of other shapes, moved past DRAFT_TIE_NATS there); every
        # stored token before it, all but the prompt step's, was drafted and kept
        assert gained["archive"] >= parted - 1, (parted, gained)


def test_prefix_cache_restore_and_speculation_compose(spec):
    eng, _, cache = spec
    text = "Minutes of the council meeting. " * 6 + "Decisions: the council agreed to"
    off = run(eng, text, 24, speculation=False)[0]
    hits = cache.hits
    on = run(eng, text, 24)[0]
    assert cache.hits > hits and on.generated == off.generated


def test_four_interleaved_users_get_their_plain_output(spec):
    eng, _, _ = spec
    texts = [REPEATS, PROSE, "Numbers: 1, 2, 3, 4, 5, 6,", "Dear Sir, I write to complain about"]

    def together(speculation: bool) -> list[list]:
        reqs = [GenerationRequest(tuple(eng.tokenize(t)), max_tokens=24, sampling=GREEDY, speculation=speculation,
                                  logprobs=2) for t in texts]
        handles = [eng.submit(r) for r in reqs]
        return [list(h.iter_sync(timeout=300)) for h in handles]

    accepted = eng.stats()["draft_accepted"]
    on, off = together(True), together(False)
    assert eng.stats()["draft_accepted"] > accepted
    for plain, spec_run in zip(off, on):
        assert_same_up_to_near_ties(reference_of(plain), spec_run[-1])


def test_siblings_draft_for_each_other_and_keep_their_output(spec):
    eng, controller, _ = spec
    off = run_events(eng, PROSE, 24, speculation=False, n=3, logprobs=2)
    kept = controller.stats["lookup"].accepted + controller.stats["archive"].accepted
    on = run(eng, PROSE, 24, n=3)
    for plain, spec_run in zip(off, on):
        assert_same_up_to_near_ties(reference_of(plain), spec_run)
    assert controller.stats["lookup"].accepted + controller.stats["archive"].accepted > kept


def test_sampled_output_distribution_is_the_targets(spec):
    """Many seeds, with and without speculation: deterministic drafts in a sampled sequence are
    checked against the draw of each position, whose random number is keyed by the seed and the
    position, so each seed gives the same tokens either way (compared seed by seed) except where
    a row computed in a batch of another shape moves a draw across a boundary (kernels' near-ties:
    a few seeds); plus a chi-square test on the first token."""
    eng, controller, _ = spec
    sampling = dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    text = "a b c a b c a b c a b c a b"
    seeds = range(1, 61)
    tally: dict[bool, collections.Counter] = {True: collections.Counter(), False: collections.Counter()}
    firsts: dict[bool, collections.Counter] = {True: collections.Counter(), False: collections.Counter()}
    drafted = {}
    by_seed: dict[bool, dict[int, tuple[int, ...]]] = {True: {}, False: {}}
    for flag in (True, False):
        before = controller.stats["lookup"].drafted + controller.stats["archive"].drafted
        reqs = [GenerationRequest(tuple(eng.tokenize(text)), max_tokens=3, speculation=flag,
                                  sampling=SamplingParams(seed=seed, **sampling)) for seed in seeds]
        for seed, handle in zip(seeds, [eng.submit(r) for r in reqs]):  # interleaved four at a time
            done = list(handle.iter_sync(timeout=300))[-1]
            tally[flag][done.generated] += 1
            firsts[flag][done.generated[:1]] += 1
            by_seed[flag][seed] = done.generated
        drafted[flag] = controller.stats["lookup"].drafted + controller.stats["archive"].drafted - before
    same = sum(by_seed[True][seed] == by_seed[False][seed] for seed in seeds)
    # measured 49 of 60 on a busy 2-core host (rows of a 4-sequence batch move by the kernels'
    # batch non-invariance); drawing with the wrong positions' numbers agrees on about half
    assert same >= 0.75 * len(seeds), (same, len(seeds))
    assert_same_distribution(tally, firsts, len(seeds), tv_bound=0.25)
    assert len(firsts[True]) >= 2  # really sampled
    assert drafted[True] > 0 and drafted[False] == 0  # drafts were verified while sampling


@pytest.fixture(scope="module")
def budgeted(gemma_path):
    # a host where a row with logits costs a quarter of a one-token step, and a tight step budget:
    # the planner must choose which users' drafts get rows and leave a newcomer's prompt its share
    costs = CostCurve({1: 0.016, 8: 0.044}, fixed=True)
    controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=8, n_parallel=4), costs=costs)
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=4096, n_parallel=4, max_draft=8, speculator=controller,
                              step_token_budget=24))
    yield eng, controller
    eng.close()


def test_the_row_budget_keeps_every_users_plain_output(budgeted):
    """Four users under one row budget, the last arriving while the others decode (its prompt goes
    in beside them, in chunks the planner leaves room for): greedy output is plain decoding's up
    to near-ties, and the copying users' drafts were kept."""
    eng, controller = budgeted
    texts = [REPEATS, PROSE, "Numbers: 1, 2, 3, 4, 5, 6,",
             "Copy the sentence twice.\nSentence: the red boat sails at noon.\nCopy: the red boat sails at noon. "
             "the red boat"]

    def together(speculation: bool) -> list[list]:
        reqs = [GenerationRequest(tuple(eng.tokenize(t)), max_tokens=24, sampling=GREEDY, speculation=speculation,
                                  logprobs=2) for t in texts]
        generated = eng.stats()["generated_tokens"]
        handles = [eng.submit(r) for r in reqs[:3]]
        deadline = time.monotonic() + 300
        while eng.stats()["generated_tokens"] < generated + 6 and time.monotonic() < deadline:
            time.sleep(0.01)  # the first users decode before the last one arrives
        handles.append(eng.submit(reqs[3]))
        return [list(h.iter_sync(timeout=300)) for h in handles]

    accepted = eng.stats()["draft_accepted"]
    off = together(False)
    on = together(True)
    assert eng.stats()["draft_accepted"] > accepted
    for plain, spec_run in zip(off, on):
        assert_same_up_to_near_ties(reference_of(plain), spec_run[-1])
