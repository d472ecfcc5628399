"""Sibling drafts (node/speculative/siblings.py): a table test of the source alone, and on the
real Gemma 3 270M a candidate joining its group late drafts the first candidate's text, keeps
it, and draws exactly what it draws without speculation."""

from __future__ import annotations

import dataclasses

import pytest

from node.engine.hooks import DraftSeq
from node.engine.types import Finished, GenerationRequest, SamplingParams
from node.speculative.siblings import SiblingDraft

PROMPT = (7, 8, 9)


def seq(key: int, group: int = 1) -> DraftSeq:
    return DraftSeq(key, group, PROMPT, True)


def test_a_sequence_behind_a_sibling_with_the_same_tokens_drafts_its_continuation():
    source = SiblingDraft()
    a, b, c = seq(1), seq(2), seq(3)
    for s in (a, b, c):
        source.begin(s)
    ahead = [*PROMPT, 1, 2, 3, 4, 5]
    assert source.propose(a, ahead, 4) is None  # nobody is ahead of it
    behind = [*PROMPT, 1, 2]
    draft = source.propose(b, behind, 2)
    assert draft is not None and draft.tokens == (3, 4) and draft.source == "sibling" and draft.match == 2
    ahead.append(6)  # the engine's live list: the sibling's growth is seen at once
    draft = source.propose(b, behind, 8)
    assert draft is not None and draft.tokens == (3, 4, 5, 6)
    assert source.propose(c, [*PROMPT, 1, 9], 4) is None  # it disagrees with every sibling
    assert source.propose(seq(4, group=2), [*PROMPT, 1, 2], 4) is None  # another group


def test_an_ended_group_drafts_for_a_member_joining_it_later():
    source = SiblingDraft()
    first = seq(1)
    source.begin(first)
    source.end(first, (*PROMPT, 5, 6, 7))
    late = seq(2)
    source.begin(late)
    draft = source.propose(late, list(PROMPT), 8)
    assert draft is None  # no output yet: nothing agreed on (the prompt is shared by construction)
    draft = source.propose(late, [*PROMPT, 5], 8)
    assert draft is not None and draft.tokens == (6, 7)


@pytest.fixture(scope="module")
def drafting(gemma_path):
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig

    controller = Controller([SiblingDraft()], ControllerConfig(max_draft=8, n_parallel=4))
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=4, max_draft=8, speculator=controller))
    yield eng, controller
    eng.close()


def finish(handle) -> Finished:
    return [e for e in handle.iter_sync(timeout=300) if isinstance(e, Finished)][0]


def test_a_late_candidate_keeps_its_siblings_text_as_drafts_and_draws_exactly(drafting):
    engine, controller = drafting
    ban = {t: float("-inf") for t in engine.model_info.eog_tokens}
    text = "Count from one to fifty: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
    request = GenerationRequest(tuple(engine.tokenize(text)), max_tokens=40,
                                sampling=SamplingParams(temperature=0.0, logit_bias=ban))
    (first,) = engine.submit_group([request], spare=1)
    answer = finish(first).generated
    late_request = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, temperature=0.3,
                                                                             seed=5))
    (late,) = engine.submit_group([late_request], group=first.group)
    late_out = finish(late).generated
    alone = finish(engine.submit(dataclasses.replace(late_request, speculation=False))).generated
    assert late_out == alone  # the drafts changed nothing the candidate draws
    stats = controller.stats.snapshot()["sibling"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0
    agreed = next((i for i, (x, y) in enumerate(zip(answer, late_out)) if x != y), len(answer))
    assert agreed >= 2  # a cold temperature: it agreed with the first candidate for a while
