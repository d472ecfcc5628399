"""The Conclave's engine side on the real Gemma 3 270M: group forks, late forks, early stop.

Forks of one prefill continue exactly like a fresh prefill of the same prompt (greedy,
bit-identical logits: the KV cells are shared through llama_memory_seq_cp); a fork joining
later clones all of the prompt but its last token from a running sibling; a Conclave's
candidate 0 is the plain greedy answer; a majority stops the others mid-generation and the
engine's slots and KV reservations are all back afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from node.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta
from node.serving.conclave.runner import ConclavePolicy, ConclaveRun

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "Question: What is 23 + 45?\nAnswer:"


def request(engine, n: int = 8) -> GenerationRequest:
    return GenerationRequest(tuple(engine.tokenize(PROMPT)), max_tokens=n, sampling=GREEDY)


def settled(engine) -> dict:
    """The engine's stats once every slot is back (the cancel is applied at its next step)."""
    for _ in range(200):
        stats = engine.stats()
        if stats["active"] == 0 and stats["queued"] == 0:
            return stats
        time.sleep(0.02)
    return engine.stats()


def finish(handle) -> Finished:
    return [e for e in handle.iter_sync(timeout=180) if isinstance(e, Finished)][0]


def test_group_forks_continue_exactly_like_a_fresh_prefill(engine):
    fresh = finish(engine.submit(request(engine)))
    before = engine.stats()["shared_prefills"]
    explorer = dataclasses.replace(request(engine), sampling=SamplingParams(temperature=0.9, seed=3))
    handles = engine.submit_group([request(engine), request(engine), explorer])
    results = [finish(h) for h in handles]
    assert engine.stats()["shared_prefills"] == before + 2  # one prefill, two clones
    assert results[0].generated == results[1].generated == fresh.generated
    assert len({h.group for h in handles}) == 1
    assert settled(engine)["kv_cells_reserved"] == 0


def test_a_late_fork_clones_the_prompt_from_a_running_sibling(engine):
    fresh = finish(engine.submit(request(engine, 12)))
    (first,) = engine.submit_group([request(engine, 12)], spare=1)
    events = first.iter_sync(timeout=180)
    assert isinstance(next(events), TextDelta)  # the first candidate is decoding
    stats = engine.stats()
    prompt = len(request(engine).prompt_tokens)
    assert stats["kv_cells_reserved"] >= prompt + 2 * 12  # reserved for the candidate to come too
    forked = stats["forked_late"]
    (late,) = engine.submit_group([request(engine, 12)], group=first.group)
    rest = [e for e in events if isinstance(e, Finished)]
    assert finish(late).generated == fresh.generated == rest[0].generated
    assert engine.stats()["forked_late"] == forked + 1
    stats = settled(engine)
    assert stats["kv_cells_reserved"] == 0 and stats["slots_free"] == stats["slots_total"]


async def test_candidate_zero_is_the_plain_greedy_answer(engine):
    plain, _ = await engine.submit(request(engine)).collect()
    loop = asyncio.get_running_loop()
    run = ConclaveRun(lambda reqs, spare, group: engine.submit_group(reqs, loop, spare=spare, group=group),
                      request(engine), 3, ConclavePolicy(adaptive=False))
    run.start()
    outcome = await run.decide()
    candidate_zero = run.candidates[0]
    assert candidate_zero.finished is not None
    if candidate_zero.finished.reason != "cancelled":  # not outvoted before its end
        assert candidate_zero.text == plain
    if outcome.verdict.winner == 0:
        assert outcome.winner.text == plain


async def test_a_majority_stops_the_others_mid_generation_and_frees_everything(engine):
    loop = asyncio.get_running_loop()
    short = request(engine, 6)
    long = dataclasses.replace(short, max_tokens=60)

    def submit(reqs, spare, group):  # candidates 3 and 4 would run long: the majority stops them
        reqs = [r if i + (0 if group is None else 3) < 3 else dataclasses.replace(r, max_tokens=long.max_tokens)
                for i, r in enumerate(reqs)]
        return engine.submit_group(reqs, loop, spare=spare, group=group)

    # explorers at temperature 0: the three short candidates agree, so 3 of 5 decide
    run = ConclaveRun(submit, short, 5, ConclavePolicy(adaptive=False, explore_temperature=0.0))
    run.start()
    outcome = await run.decide()
    assert outcome.verdict.method == "majority" and outcome.verdict.consensus == 3
    assert outcome.stopped_early and outcome.cancelled == 2
    losers = run.candidates[3:]
    assert all(c.finished is not None and c.finished.reason == "cancelled" for c in losers)
    assert all(c.finished.completion_tokens < long.max_tokens for c in losers if c.finished is not None)
    stats = engine.stats()
    assert stats["active"] == 0 and stats["queued"] == 0
    assert stats["kv_cells_reserved"] == 0 and stats["kv_cells_used"] == 0
    assert stats["slots_free"] == stats["slots_total"]
