"""The draft-model source on the real model: Gemma 3 270M drafts for itself (the only model
here), so drafts are mostly kept and every verification path runs: greedy drafts checked by
argmax, sampled drafts verified by rejection sampling against their distributions, and the
KV rollback after rejected drafts. Speed is not tested (a draft as large as the target
cannot pay); correctness and the refusals are."""

from __future__ import annotations

import collections

import pytest

from node.engine.engine import Engine, EngineConfig
from node.engine.types import GenerationRequest, SamplingParams
from node.speculative.controller import Controller, ControllerConfig
from node.speculative.costs import CostCurve
from node.speculative.draft_model import DraftModel, VocabularyMismatch, check_vocabularies
from tests.node.near_ties import assert_same_up_to_near_ties, draw_near_an_edge, first_parting, reference_of
from tests.node.speculative.test_speculation_engine import GREEDY, PROSE, REPEATS, assert_same_distribution

pytestmark = pytest.mark.model


class FreeDraftModel(DraftModel):
    """The real draft model, but it reports drafts as free to make, so the controller verifies
    every draft with a fair chance (the measured cost would rightly switch a same-size draft
    model off, and nothing would be verified)."""

    @property
    def cost_per_token(self) -> float:
        return 0.0

    @cost_per_token.setter
    def cost_per_token(self, value: float) -> None:
        self.measured_cost = value


@pytest.fixture(scope="module")
def drafted(gemma_path):
    source = FreeDraftModel(gemma_path, target_path=gemma_path, n_ctx=2048, n_parallel=4, n_threads=2)
    controller = Controller([source], ControllerConfig(max_draft=6, n_parallel=4),
                            costs=CostCurve({1: 0.0126, 8: 0.0150}, fixed=True))
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=4, max_draft=6, speculator=controller,
                              step_token_budget=64, max_queue=128))
    yield eng, controller, source
    eng.close()
    source.close()


def generate(eng, text, n_tokens, *, speculation=True, sampling=GREEDY, logprobs=None):
    req = GenerationRequest(tuple(eng.tokenize(text)), max_tokens=n_tokens, sampling=sampling,
                            speculation=speculation, logprobs=logprobs)
    return list(eng.submit(req).iter_sync(timeout=300))


def test_greedy_drafts_from_a_draft_model_keep_the_plain_output(drafted):
    eng, controller, source = drafted
    for text in (REPEATS, PROSE, "Dear Sir, I write to complain about"):
        plain = generate(eng, text, 24, speculation=False, logprobs=2)
        on = generate(eng, text, 24)[-1]
        assert_same_up_to_near_ties(reference_of(plain), on)
    stats = controller.stats["model"]
    assert stats.drafted > 20 and stats.accepted > stats.drafted // 2  # it drafts for itself: mostly kept
    assert source.measured_cost > 0  # what making a draft took was measured


def test_sampled_drafts_are_verified_by_rejection_and_keep_the_targets_distribution(drafted):
    eng, controller, _ = drafted
    sampling = dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    text = "a b c a b c a b c a b c a b"  # a peaked distribution: 60 samples estimate it well
    tally: dict[bool, collections.Counter] = {True: collections.Counter(), False: collections.Counter()}
    firsts: dict[bool, collections.Counter] = {True: collections.Counter(), False: collections.Counter()}
    for flag in (True, False):
        before = controller.stats["model"].drafted
        reqs = [GenerationRequest(tuple(eng.tokenize(text)), max_tokens=3, speculation=flag,
                                  sampling=SamplingParams(seed=seed, **sampling)) for seed in range(1, 61)]
        for handle in [eng.submit(r) for r in reqs]:
            done = list(handle.iter_sync(timeout=300))[-1]
            tally[flag][done.generated] += 1
            firsts[flag][done.generated[:1]] += 1
        assert (controller.stats["model"].drafted > before) == flag
    # The draft model is the target itself (q close to p), so this checks the path end to end on
    # the real model; whether the sampler is exact when q differs from p is proven on synthetic
    # distributions (tests/node/engine/test_rejection_sampling.py). Two samples of 60 from one
    # distribution with a long tail differ by a total variation near 0.25 on their own.
    assert_same_distribution(tally, firsts, 60, tv_bound=0.35)
    assert controller.stats["model"].accepted > 0


def test_a_draft_model_that_tokenizes_differently_is_refused(gemma_path):
    from node.engine.llama import LlamaModel

    target = LlamaModel(gemma_path, vocab_only=True)
    try:
        check_vocabularies(target, target)  # the same vocabulary passes

        class OnePieceOff:
            """The real vocabulary with one piece changed (no second vocabulary exists here)."""

            info, n_vocab = target.info, target.n_vocab

            def token_piece(self, token: int) -> bytes:
                return b"<changed>" if token == 1000 else target.token_piece(token)

        with pytest.raises(VocabularyMismatch, match="token 1000"):
            check_vocabularies(target, OnePieceOff())  # type: ignore[arg-type]
    finally:
        target.close()


def test_the_model_source_needs_its_path_and_a_bad_path_is_a_clear_error(tmp_path, gemma_path):
    from node.config import ConfigError, load_settings
    from node.models.errors import ModelError
    from node.assembly import build_speculator
    from node.models.loader import plan_engine

    env = {"REAME_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="needs both"):
        load_settings(None, {"speculative.sources": "model"}, env=env)
    settings = load_settings(None, {"model.path": str(gemma_path), "speculative.sources": "lookup,model",
                                    "speculative.draft_model_path": str(tmp_path / "missing.gguf")}, env=env)
    with pytest.raises(ModelError, match="draft_model_path .*missing.gguf"):
        build_speculator(settings, plan_engine(settings))


def test_a_seeded_sampled_request_with_a_draft_model_gives_the_same_text_every_time(drafted):
    """A seeded request's draft model draws with the target's own Gumbel noise and its drafts are
    verified as deterministic ones, so the text is plain decoding's with that seed, whatever
    draft lengths the controller chose as it learned (with rejection sampling the text followed
    them, and the second run here parted from the first at its 15th token). The draft model is
    the target itself: coupled draws agree nearly always. Plain decoding's text is matched up to
    a draw near an edge, which a verify step's shape may move (on repacked kernels it parted at
    its 12th token, where a logit move under NEAR_TIE draws otherwise)."""
    eng, controller, _ = drafted
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, min_p=0.0, seed=4242)
    stats = controller.stats["model"]
    before, kept_before = stats.drafted, stats.accepted
    final, logprobs = reference_of(generate(eng, PROSE, 24, speculation=False, sampling=sampling, logprobs=20))
    plain = final.generated
    runs = [generate(eng, PROSE, 24, sampling=sampling)[-1].generated for _ in range(3)]
    assert stats.drafted > before and stats.accepted - kept_before >= 0.8 * (stats.drafted - before)
    assert runs[0] == runs[1] == runs[2]
    first = first_parting(plain, runs[0])
    if first is not None:  # a verify step's rows may move a logit a little (tests/node/near_ties.py)
        top = [(token, logprob) for token, _, logprob in logprobs[first].top]
        assert draw_near_an_edge(sampling, eng._model.n_vocab, len(eng.tokenize(PROSE)) + first, top), (
            f"the seeded text left plain decoding's at token {first}, where its draw was far from any edge")
