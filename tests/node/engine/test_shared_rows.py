"""Identical siblings share one row of logits (node/engine/riders.py), on the real Gemma 3 270M.

A group of seeded sampled candidates over a prompt the model continues with confidence (a count)
draws the same tokens for a while; each rides its leader's rows until its own draw differs (the
free choice after the count).
Exactness: the candidates' outputs are the same with shared rows and without (each seeded
candidate draws at each position from the row its own context gives, with its own random
number), and the engine reports the tokens drawn from a shared row. An engine of the same
model with `shared_rows=False` is the baseline, in the same test.
"""

from __future__ import annotations

import dataclasses

import pytest

from node.engine.riders import riders
from node.engine.types import Finished, GenerationRequest, SamplingParams

TEXT = "Count from one to fifteen and then name an animal: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def fresh_engine(gemma_path, shared_rows: bool):
    """An engine of its own: the KV cells its sequences take, and so the order in which
    attention sums their keys, do not depend on what the suite's shared engine served before (a
    sampled draw at a near-tie of two tokens' scores follows those last bits)."""
    from node.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=4, n_batch=512, max_queue=16,
                               step_token_budget=64, seq_cells=1024, shared_rows=shared_rows))


@pytest.fixture(scope="module")
def unshared(gemma_path):
    eng = fresh_engine(gemma_path, shared_rows=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def shared(gemma_path):
    eng = fresh_engine(gemma_path, shared_rows=True)
    yield eng
    eng.close()


def candidates(engine, n: int = 3, tokens: int = 40) -> list[GenerationRequest]:
    ban = {t: float("-inf") for t in engine.model_info.eog_tokens}
    base = GenerationRequest(tuple(engine.tokenize(TEXT)), max_tokens=tokens,
                             sampling=SamplingParams(temperature=0.8, seed=11, logit_bias=ban))
    return [dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=11 + i)) for i in range(n)]


def outputs(engine, reqs: list[GenerationRequest]) -> list[tuple[int, ...]]:
    handles = engine.submit_group(reqs)
    return [[e for e in h.iter_sync(timeout=300) if isinstance(e, Finished)][0].generated for h in handles]


def test_identical_candidates_share_rows_and_draw_what_they_draw_alone(shared, unshared):
    before = shared.stats()["shared_rows"]
    riding = outputs(shared, candidates(shared))
    drawn = shared.stats()["shared_rows"] - before
    alone = outputs(unshared, candidates(unshared))
    assert unshared.stats()["shared_rows"] == 0
    assert riding == alone
    assert drawn > 0  # the candidates agreed for a while and rode a sibling's rows meanwhile
    # the model counts on with confidence, so they agree for the first tokens and shared those
    # steps; the animal is a free choice, where their own draws part them: a rider drew its own
    assert all(out[:8] == alone[0][:8] for out in alone)
    assert len(set(alone)) > 1


@dataclasses.dataclass
class _Seq:
    group: int
    n_past: int
    tokens: list[int]
    pending: list[int]


def test_riders_are_the_group_members_with_the_same_tokens_so_far():
    a = _Seq(1, 5, [1, 2, 3, 4, 5, 6], [6])
    b = _Seq(1, 5, [1, 2, 3, 4, 5, 6], [6])
    c = _Seq(1, 5, [1, 2, 3, 4, 9, 6], [6])  # same length and last token, another token before it
    d = _Seq(2, 5, [1, 2, 3, 4, 5, 6], [6])  # the same tokens in another group
    e = _Seq(1, 4, [1, 2, 3, 4, 5, 6], [5, 6])  # a jump-forward pending run: another KV length
    leaders, riding = riders([a, b, c, d, e])
    assert leaders == [a, c, d, e]
    assert riding == {id(a): [b]}
