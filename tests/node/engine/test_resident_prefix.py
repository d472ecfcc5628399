"""Resident prefixes on the real Gemma model: a free slot keeps its KV, and the next prompt
sharing its prefix continues from the exact token it differs at.

One document of ~1,500 tokens with different questions, asked one after another: every
question after the first prefills only its own tokens (the engine's prefill counter and the
request's `cached_tokens` say so), and the answers are the ones an engine without resident
prefixes gives, up to near-ties (tests/node/near_ties.py). A conversation that extends the
last prompt and answer continues after both; forks, cancels and KV pressure keep working.
"""

from __future__ import annotations

import pytest

from node.engine.budget import common_prefix
from node.engine.engine import Engine, EngineConfig
from node.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta
from tests.node.near_ties import assert_same_up_to_near_ties, reference_of

pytestmark = [pytest.mark.model]

PAGE = " ".join(
    f"Entry {i}: the crate labelled {('amber', 'birch', 'cobalt', 'dune', 'ember')[i % 5]}-{i * 7 % 31} "
    f"left bay {i % 9} at {6 + i % 12} o'clock with {i * 3 % 17 + 2} boxes of "
    f"{('tea', 'rope', 'nails', 'salt', 'wool', 'ink')[i % 6]}."
    for i in range(60))
QUESTIONS = (
    "\nQuestion: which bay did entry 12 leave from?\nAnswer:",
    "\nQuestion: what did entry 40 carry?\nAnswer:",
    "\nQuestion: how many boxes left with entry 7?\nAnswer:",
)
CFG = dict(n_ctx=4096, n_parallel=2, n_batch=512, n_ubatch=512, seq_cells=2048, step_token_budget=256)


def never_end(engine: Engine) -> SamplingParams:
    """Greedy without end-of-generation tokens: every request runs its max_tokens, so each
    divergence has a logprob entry to judge it by."""
    return SamplingParams(temperature=0.0, logit_bias={token: -100.0 for token in engine.model_info.eog_tokens})


def run(engine: Engine, prompt, max_tokens: int = 10, logprobs: int | None = None) -> tuple[Finished, list]:
    req = GenerationRequest(tuple(prompt), max_tokens=max_tokens, sampling=never_end(engine), logprobs=logprobs)
    events = list(engine.submit(req).iter_sync(timeout=300))
    final = events[-1]
    assert isinstance(final, Finished) and final.reason in ("stop", "length"), final.error
    return reference_of(events)


@pytest.fixture(scope="module")
def engines(gemma_path):
    resident = Engine(EngineConfig(model_path=gemma_path, **CFG))
    plain = Engine(EngineConfig(model_path=gemma_path, resident_prefixes=False, **CFG))
    yield resident, plain
    resident.close()
    plain.close()


def test_document_questions_in_turn_prefill_only_the_question(engines):
    resident, plain = engines
    prompts = [resident.tokenize(PAGE + q) for q in QUESTIONS]
    page = len(resident.tokenize(PAGE))
    assert 1000 < page < 2000
    in_kv: list[int] = []  # what the resident slot holds after the previous question
    for i, prompt in enumerate(prompts):
        reference = run(plain, prompt, logprobs=2)
        before = resident.stats()
        final, _ = run(resident, prompt)
        after = resident.stats()
        kept = min(common_prefix(in_kv, prompt), len(prompt) - 1)
        if i == 0:
            assert kept == 0 and final.cached_tokens == 0
        else:
            assert kept >= page - 2  # the page (its last token may merge with the question's first)
            assert final.cached_tokens == kept
            assert after["resident_hits"] - before["resident_hits"] == 1
            assert after["resident_tokens"] - before["resident_tokens"] == kept
        assert after["prefill_tokens"] - before["prefill_tokens"] == len(prompt) - kept
        assert_same_up_to_near_ties(reference, final)
        # the KV holds the prompt and every generated token but the last (never decoded)
        in_kv = list(prompt) + list(final.generated[:-1])
    assert plain.stats()["resident_hits"] == 0 and plain.stats()["slots_resident"] == 0


def test_a_conversation_continues_after_the_last_answer(engines):
    resident, plain = engines
    first = resident.tokenize(PAGE + QUESTIONS[0])
    answer, _ = run(resident, first, max_tokens=6)
    turn = first + list(answer.generated) + resident.tokenize("\nQuestion: and entry 13?\nAnswer:", add_bos=False)
    reference = run(plain, turn, logprobs=2)
    before = resident.stats()
    final, _ = run(resident, turn)
    assert final.cached_tokens == len(first) + len(answer.generated) - 1  # all the KV held
    assert resident.stats()["prefill_tokens"] - before["prefill_tokens"] == len(turn) - final.cached_tokens
    assert_same_up_to_near_ties(reference, final)


def test_forks_of_a_resident_prompt_and_a_cancel(engines):
    resident, plain = engines
    prompt = resident.tokenize(PAGE + QUESTIONS[1])
    run(resident, prompt, max_tokens=4)
    reference = run(plain, prompt, logprobs=2)
    req = GenerationRequest(tuple(prompt), max_tokens=10, sampling=never_end(resident))
    hits = resident.stats()["resident_hits"]
    finals = [list(h.iter_sync(timeout=300))[-1] for h in resident.submit_n(req, 2)]
    # the first continues from the resident KV; the second follows it, or (one slot per request
    # here: group_slots) continues from the first's KV once that is resident in turn
    assert resident.stats()["resident_hits"] in (hits + 1, hits + 2)
    for final in finals:
        assert isinstance(final, Finished) and final.reason == "length"
        assert_same_up_to_near_ties(reference, final)
    assert finals[0].generated == finals[1].generated  # one KV, the same greedy choices

    handle = resident.submit(GenerationRequest(tuple(prompt), max_tokens=200, sampling=never_end(resident)))
    for event in handle.iter_sync(timeout=300):
        if isinstance(event, TextDelta):
            handle.cancel()  # a client that goes away mid-answer
    stats = resident.stats()
    assert stats["slots_free"] == 2 and stats["kv_cells_reserved"] == 0  # the slot is free again
    final, _ = run(resident, prompt)
    assert final.cached_tokens == len(prompt) - 1  # and its KV still serves the same prompt


def test_resident_kv_gives_way_to_reservations(gemma_path):
    """A prompt of its own whose reservation needs the cells a resident slot holds: the
    resident KV goes and the prompt runs to its end (no decode fails for lack of room)."""
    small = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=2, n_batch=512, seq_cells=2048))
    try:
        run(small, small.tokenize(PAGE + QUESTIONS[2]), max_tokens=2)
        assert small.stats()["slots_resident"] == 1
        # a long prompt and a short answer (prefill costs a fraction of a decode step a token):
        # with the answer it needs the whole context, so the resident slot's cells must go
        other = (small.tokenize("Report. " + PAGE) + small.tokenize(" " + PAGE, add_bos=False))[:2048 - 40]
        final, _ = run(small, other, max_tokens=2048 - len(other) - 8)
        assert final.reason == "length" and final.cached_tokens == 0
        stats = small.stats()
        assert stats["resident_evicted"] == 1 and stats["slots_resident"] == 1  # the new one's KV stays
    finally:
        small.close()


def test_questions_sent_together_copy_the_page_from_the_first(engines):
    """Two questions over the page sent at once, nothing resident for them: the first prefills
    the page (in chunks of the step budget, the model's sliding window over it), the second
    waits for it and starts from a copy of its KV (scheduler.py `_copy_prefix`), prefilling
    only its question. A third, sent while both decode, waits for a slot and continues from
    the KV the first to finish leaves resident. The answers are what an engine without resident
    prefixes gives, up to near-ties."""
    resident, plain = engines
    prompts = [resident.tokenize("Log. " + PAGE + q) for q in QUESTIONS]
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    references = [run(plain, p, logprobs=2) for p in prompts]
    before = resident.stats()

    def submit(prompt):
        return resident.submit(GenerationRequest(tuple(prompt), max_tokens=10, sampling=never_end(resident)))

    first, second = submit(prompts[0]), submit(prompts[1])
    events = [first.iter_sync(timeout=300), second.iter_sync(timeout=300)]
    next(e for e in events[0] if isinstance(e, TextDelta))  # both decoding (the second is admitted first)
    third = submit(prompts[2])
    finals = [list(stream)[-1] for stream in events] + [list(third.iter_sync(timeout=300))[-1]]
    after = resident.stats()
    assert after["prefix_waits"] - before["prefix_waits"] == 1
    assert after["prefix_copies"] - before["prefix_copies"] == 1
    assert finals[0].cached_tokens == 0 and finals[1].cached_tokens >= shared and finals[2].cached_tokens >= shared
    copied = after["prefix_copied_tokens"] - before["prefix_copied_tokens"]
    assert after["prefill_tokens"] - before["prefill_tokens"] == sum(map(len, prompts)) - copied - (
        after["resident_tokens"] - before["resident_tokens"])
    for reference, final in zip(references, finals):
        assert isinstance(final, Finished) and final.reason == "length"
        assert_same_up_to_near_ties(reference, final)


def test_the_exact_fork_a_resident_slot_holds_is_stored_for_later_prompts(gemma_path, engines):
    """A question that continues from another's resident slot holds the page up to the token
    where the two depart, and no prefill chunk ends there; the prefix cache wants that exact
    fork (node/cache/forks.py), so the slot's state is stored as it stands. Once other prompts
    have taken both slots, a third question restores the page from the cache to the token."""
    from node.cache import PrefixCache, PrefixCacheConfig, engine_identity
    from node.models.fingerprint import model_fingerprint

    _, plain = engines
    identity = engine_identity(model_fingerprint(gemma_path), "f16")
    cache = PrefixCache(identity, PrefixCacheConfig(checkpoint_tokens=0, exact_min_gain_tokens=1))
    engine = Engine(EngineConfig(model_path=gemma_path, prefix_cache=cache, **CFG))
    try:
        first, second, third = (engine.tokenize(PAGE + q) for q in QUESTIONS)
        fork = common_prefix(first, second)
        assert fork % cache.chain.block_tokens and common_prefix(first, third) == fork
        run(engine, first, max_tokens=2)
        held, _ = run(engine, second, max_tokens=2)
        assert held.cached_tokens == fork and cache.stats()["exact_stores"] == 1
        for other in ("The weather in the hills was", "A list of rivers:"):  # both slots go to others
            run(engine, engine.tokenize(other), max_tokens=2)
        reference = run(plain, third, logprobs=2)
        final, _ = run(engine, third)
        assert final.cached_tokens == fork and cache.stats()["exact_hits"] == 1
        assert_same_up_to_near_ties(reference, final)
    finally:
        engine.close()
        cache.close()
