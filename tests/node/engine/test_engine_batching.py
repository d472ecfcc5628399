"""Several sequences in one batch on the real Gemma 3 270M: agreement, forks, cancel, floods.

Batched greedy text versus each prompt alone: llama.cpp's CPU kernels are not
batch-invariant. With the same sequence alone or forked (KV cells shared through
llama_memory_seq_cp), logits are bit-identical; but a prompt prefilled or decoded in the
same ubatch as *other* sequences can move logits by a few tenths (max |diff| over the
vocabulary measured 0.6-0.95 here, with and without flash attention). Greedy text then
differs only where the two best tokens are nearly tied. Measured on 8 prompts x 16
tokens (4 per batch): 4 of 8 prompts diverge, at tokens 3, 4, 7 and 11, always where the
alone-run's top-2 gap is under 0.1 nats (0.036-0.097); 89 of 128 tokens are identical
before the first divergence. The test therefore demands identical text up to the first
near-tie (gap < NEAR_TIE), so a real mix-up of sequences (divergence at a clear margin)
fails.
"""

from __future__ import annotations

import time

import pytest

from node.engine.engine import Engine, EngineConfig
from node.engine.errors import EngineOverloaded
from node.engine.types import GenerationRequest, SamplingParams, TextDelta
from tests.node.near_ties import NEAR_TIE, first_parting, reference_of

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ("One, two, three,", "The capital of France is", "def fib(n):", "My favourite colour is")


def greedy(engine, text: str, n: int = 16, **kw) -> GenerationRequest:
    return GenerationRequest(tuple(engine.tokenize(text)), max_tokens=n, sampling=GREEDY, **kw)


def finish(handle):
    return reference_of(list(handle.iter_sync(timeout=180)))


def test_four_together_match_each_alone_up_to_near_ties(engine):
    alone = [finish(engine.submit(greedy(engine, p, logprobs=2))) for p in PROMPTS]
    handles = [engine.submit(greedy(engine, p)) for p in PROMPTS]
    together = [finish(h)[0] for h in handles]
    for (solo, logprobs), batched in zip(alone, together):
        assert solo.reason in ("length", "stop") and batched.reason in ("length", "stop")
        a, b = solo.generated, batched.generated
        first = first_parting(a, b)
        if first is None:
            continue
        gap = logprobs[first].top[0][2] - logprobs[first].top[1][2]
        assert gap < NEAR_TIE, f"prompt {solo} diverged at token {first} with a clear margin {gap:.3f}"


def test_fork_continues_exactly_like_a_fresh_prefill(engine):
    fresh = finish(engine.submit(greedy(engine, "The quick brown fox", 12)))[0]
    before = engine.stats()["shared_prefills"]
    forks = [finish(h)[0] for h in engine.submit_n(greedy(engine, "The quick brown fox", 12), 3)]
    assert engine.stats()["shared_prefills"] == before + 2  # two clones, one prefill
    for fork in forks:
        assert fork.generated == fresh.generated


def test_cancelled_leader_hands_its_prefill_to_a_fork(gemma_path):
    # resident prefixes off: the reference run's slot would otherwise hold the prompt, and the
    # leader would continue from it instead of prefilling the prompt the fork takes over
    engine = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=4, n_batch=512, max_queue=16,
                                 step_token_budget=64, seq_cells=1024, resident_prefixes=False))
    try:
        handed_over(engine)
    finally:
        engine.close()


def handed_over(engine):
    text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(50))
    req = GenerationRequest(tuple(engine.tokenize(text))[:600], max_tokens=6, sampling=GREEDY)
    fresh = finish(engine.submit(req))[0]
    before = engine.stats()["prefill_tokens"]
    leader, *forks = engine.submit_n(req, 3)
    while engine.stats()["prefill_tokens"] < before + 512:  # first chunk done, 88 tokens to go
        time.sleep(0.001)
    leader.cancel()
    assert finish(leader)[0].reason == "cancelled"
    for fork in forks:
        assert finish(fork)[0].generated == fresh.generated
    assert engine.stats()["prefill_tokens"] == before + 600  # the prompt went in once


def test_submit_n_sampled_choices_differ_and_repeat_with_a_seed(engine):
    req = GenerationRequest(tuple(engine.tokenize("Once upon a time")), max_tokens=10,
                            sampling=SamplingParams(temperature=1.0, seed=7))
    first = [finish(h)[0].generated for h in engine.submit_n(req, 3)]
    again = [finish(h)[0].generated for h in engine.submit_n(req, 3)]
    assert first == again
    assert len(set(first)) > 1


def test_cancel_frees_the_slot_at_once(engine):
    handle = engine.submit(greedy(engine, "Count slowly: 1, 2, 3,", 400))
    events = handle.iter_sync(timeout=180)
    assert isinstance(next(events), TextDelta)
    handle.cancel()
    last = list(events)[-1]
    assert last.reason == "cancelled" and last.completion_tokens < 400
    stats = engine.stats()
    assert stats["active"] == 0 and stats["slots_free"] == stats["slots_total"]
    assert stats["kv_cells_reserved"] == 0


@pytest.fixture(scope="module")
def small_engine(gemma_path):
    """A 512-cell context: two 200-token prompts fill it, so a flood must queue (a sequence may
    use 256 cells, not the default 512 / 4, so one such prompt fits a sequence)."""
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=512, n_parallel=4, n_batch=256,
                              max_queue=6, step_token_budget=64, seq_cells=256))
    yield eng
    eng.close()


def test_a_flood_of_long_prompts_never_fails_the_batch(small_engine):
    eng = small_engine
    prompts = [" ".join(f"item {i}-{j}" for j in range(50)) for i in range(6)]
    requests = [GenerationRequest(tuple(eng.tokenize(p))[:200], max_tokens=4, sampling=GREEDY) for p in prompts]
    assert all(len(r.prompt_tokens) == 200 for r in requests)
    handles = [eng.submit(r) for r in requests]
    with pytest.raises(EngineOverloaded):  # max_queue waiting: the next one is refused, not queued
        for _ in range(7):
            handles.append(eng.submit(requests[0]))
    reasons = [finish(h)[0].reason for h in handles]
    assert reasons == ["length"] * len(handles)
    stats = eng.stats()
    assert stats["kv_cells_reserved"] == 0 and stats["slots_free"] == 4


def test_identical_prompts_of_two_tenants_do_not_share_a_prefill(engine):
    """Two submits of one prompt in flight together share its prefill (the second clones the
    first's KV), which would tell the second tenant, by its time to first token, that someone
    sent the same prompt: only requests of one cache scope share."""
    def document(title: str) -> tuple[int, ...]:  # a prompt no slot holds yet (resident KV stays per slot)
        text = " ".join(f"{title} row {i}: a tenant's own document, line after line." for i in range(50))
        return tuple(engine.tokenize(text))[:600]

    def pair(scopes, tokens):
        before = engine.stats()
        handles = [engine.submit(GenerationRequest(tokens, max_tokens=2, sampling=GREEDY, cache_scope=scope))
                   for scope in scopes]
        for handle in handles:
            assert finish(handle)[0].reason in ("length", "stop")
        after = engine.stats()
        return after["shared_prefills"] - before["shared_prefills"], after["prefill_tokens"] - before["prefill_tokens"]

    assert pair(("tenant-a", "tenant-a"), document("first")) == (1, 600)  # one scope: one prefill, one clone
    assert pair(("tenant-a", "tenant-b"), document("second")) == (0, 1200)  # two scopes: each prefills its own
