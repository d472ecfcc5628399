"""What plugs into the scheduler, on the real model: draft verification and the prefix cache.

The proposer and the prefix cache here are small real implementations of the two hook
protocols (a dictionary of states; drafts from a known continuation), not mocks: the
engine runs them exactly as it runs the node's own. Both are on in the same engine, as
in production, so the test also shows that neither switches the other off.
"""

from __future__ import annotations

import statistics

from typing import Sequence

import pytest

from node.engine.engine import Draft, DraftSeq, Engine, EngineConfig
from node.engine.hooks import StepPlan
from node.engine.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
BLOCK = 16


CONTEXT = 4000  # of the fixture's 4,096 cells: a context whose attention a step of 5 rows shows


class ScriptedDrafts:
    """A Speculator proposing the continuation of a scripted token stream whenever the tail matches it."""

    def __init__(self) -> None:
        self.script: tuple[int, ...] = ()
        self.garbage = False
        self.calls = 0
        self.kept: list[tuple[int, int]] = []
        self.begun: set[int] = set()
        self.calibrated = 0
        self.attended: list[float | None] = []

    def calibrate(self, measure, attend) -> None:
        self.calibrated = measure(1, 3)
        attend(0, 4)  # the first step of its shape pays one-off costs
        # in turn, so that a load that comes and goes weighs on both alike (the context, once
        # computed, is kept between the calls)
        empty, late = [], []
        for _ in range(8):
            empty.append(attend(0, 4))
            late.append(attend(CONTEXT, 4))
        self.attended = [statistics.median(empty[:4]), statistics.median(late), statistics.median(empty[4:]),
                         attend(10**9, 4), attend(0, 16)]

    def begin(self, seq: DraftSeq) -> None:
        self.begun.add(seq.key)

    def end(self, seq: DraftSeq, tokens) -> None:
        self.begun.discard(seq.key)

    def plan(self, n_decoding: int, asks, prefill: int, budget: int, draining=None, refill=0.0) -> StepPlan:
        drafts = {}
        for ask in asks:
            draft = self.propose(ask.seq, ask.context, ask.room)
            if draft is not None and draft.tokens:
                drafts[ask.seq.key] = draft
        return StepPlan(drafts, prefill)

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float, spans=()) -> None:
        pass

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        self.kept.append((len(draft.tokens), accepted))

    def propose(self, seq: DraftSeq, tokens: Sequence[int], max_tokens: int) -> Draft | None:
        self.calls += 1
        if self.garbage:
            return Draft((7, 7, 7, 7)[:max_tokens], "scripted")
        n = len(tokens)
        if self.script[: n] == tuple(tokens):
            return Draft(self.script[n: n + max_tokens], "scripted")
        return None


class DictPrefixCache:
    """States at every BLOCK-token boundary, in a dictionary keyed by the prefix."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, ...], bytes] = {}
        self.hits = 0

    def lookup(self, prompt_tokens, scope="", beyond=0):
        for n in range((len(prompt_tokens) - 1) // BLOCK * BLOCK, beyond, -BLOCK):
            state = self.states.get(tuple(prompt_tokens[:n]))
            if state is not None:
                self.hits += 1
                return n, state
        return None

    def boundaries_to_store(self, prompt_tokens, scope=""):
        return [n for n in range(BLOCK, len(prompt_tokens), BLOCK) if tuple(prompt_tokens[:n]) not in self.states]

    def store(self, prompt_tokens, n_tokens, state, scope=""):
        self.states[tuple(prompt_tokens[:n_tokens])] = state


@pytest.fixture(scope="module")
def hooked(gemma_path):
    drafts, cache = ScriptedDrafts(), DictPrefixCache()
    # resident prefixes off: a resident slot would answer the prompts the cache is tested with
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=4096, n_parallel=2, max_draft=4, resident_prefixes=False,
                              speculator=drafts, prefix_cache=cache, step_token_budget=64))
    assert eng.wait_calibrated(120)  # before any request: a waiting one would stop the measuring
    yield eng, drafts, cache
    eng.close()


def generate(eng, text: str, n: int = 12):
    req = GenerationRequest(tuple(eng.tokenize(text)), max_tokens=n, sampling=GREEDY)
    return list(eng.submit(req).iter_sync(timeout=180))[-1]


def test_verified_drafts_give_plain_greedy_output(hooked):
    eng, drafts, _ = hooked
    prompt = "One, two, three,"
    plain = generate(eng, prompt)  # empty script: no drafts offered
    drafts.script = tuple(eng.tokenize(prompt)) + plain.generated
    accepted = eng.stats()["draft_accepted"]
    assert generate(eng, prompt).generated == plain.generated
    assert eng.stats()["draft_accepted"] - accepted >= 6  # most tokens came in verified groups
    assert drafts.calibrated > 0 and not drafts.begun  # measured before serving; every sequence ended
    # 5 rows after CONTEXT tokens of context cost more than after none (computed, then kept for the
    # next measure), after none again less; a context no slot holds, or more drafts than a
    # sequence may have (the logits buffer has no rows for them): None
    empty, late, again, too_long, too_many = drafts.attended
    assert empty is not None and late is not None and again is not None and too_long is None and too_many is None
    assert late > empty * 1.05 and again < late
    assert sum(a for _, a in drafts.kept) == eng.stats()["draft_accepted"] - accepted
    drafts.kept.clear()
    drafts.garbage = True
    rejected = eng.stats()["draft_rejected"]
    try:
        assert generate(eng, prompt).generated == plain.generated
    finally:
        drafts.garbage = False
    assert eng.stats()["draft_rejected"] > rejected
    assert drafts.kept and all(a == 0 for _, a in drafts.kept)  # 7, 7, 7, 7 never fits


def test_prefix_cache_restores_and_gives_the_same_output(hooked):
    eng, drafts, cache = hooked
    drafts.script = ()
    text = "Notes from the harbour office. " * 8 + "Summary:"
    first = generate(eng, text, 8)
    assert len(cache.states) >= 3  # a state at each 16-token boundary of the prompt
    stored = eng.stats()["prefix_tokens_restored"]
    second = generate(eng, text, 8)
    assert cache.hits >= 1 and eng.stats()["prefix_tokens_restored"] > stored
    assert second.generated == first.generated


def test_final_state_of_prompt_and_answer_is_stored_only_when_asked(hooked):
    eng, drafts, cache = hooked
    drafts.script = ()
    no_end = {t: -100.0 for t in eng.model_info.eog_tokens}  # the answer runs its length
    sampling = SamplingParams(temperature=0.0, logit_bias=no_end)

    def answer(text: str, store: bool):
        req = GenerationRequest(tuple(eng.tokenize(text)), max_tokens=30, sampling=sampling, store_final_state=store)
        return req.prompt_tokens, list(eng.submit(req).iter_sync(timeout=180))[-1]

    prompt, plain = answer("A ledger of the lighthouse keeper, entry one:", store=False)
    assert plain.reason == "length"
    beyond = [k for k in cache.states if len(k) > len(prompt) and k[:len(prompt)] == prompt]
    assert not beyond  # without the flag: prompt boundaries only

    stored_before = eng.stats()["final_states_stored"]
    prompt, done = answer("A ledger of the lighthouse keeper, entry two:", store=True)
    assert done.reason == "length" and eng.stats()["final_states_stored"] == stored_before + 1
    # the last sampled token was never decoded: the KV holds prompt + all but the last answer token
    n_kv = len(prompt) + len(done.generated) - 1
    last = n_kv // BLOCK * BLOCK
    assert last > len(prompt) and tuple((*prompt, *done.generated)[:last]) in cache.states

    restored = eng.stats()["prefix_tokens_restored"]
    follow = GenerationRequest((*prompt, *done.generated, *eng.tokenize(" Next:", add_bos=False)), max_tokens=2,
                               sampling=GREEDY)
    assert list(eng.submit(follow).iter_sync(timeout=180))[-1].reason in ("stop", "length")
    assert eng.stats()["prefix_tokens_restored"] == restored + last


def test_drafts_are_reported_when_a_sequence_ends_inside_them(hooked):
    eng, drafts, _ = hooked
    prompt = "One, two, three,"
    plain = generate(eng, prompt)
    drafts.script = tuple(eng.tokenize(prompt)) + plain.generated
    # the first step after the prompt verifies generated[1:5] as drafts: a stop string that
    # completes with generated[2] ends the sequence in the middle of them
    stop = eng.detokenize(plain.generated[1:3]).decode("utf-8", "replace")
    before_text = eng.detokenize(plain.generated[:1]).decode("utf-8", "replace")
    assert stop.strip() and stop not in before_text
    drafts.kept.clear()
    accepted, rejected = eng.stats()["draft_accepted"], eng.stats()["draft_rejected"]
    req = GenerationRequest(tuple(eng.tokenize(prompt)), max_tokens=12, sampling=GREEDY, stop=(stop,))
    done = list(eng.submit(req).iter_sync(timeout=180))[-1]
    assert done.reason == "stop" and done.generated == plain.generated[:3]
    assert drafts.kept, "the drafts of the last step were never reported"
    assert sum(a for _, a in drafts.kept) == eng.stats()["draft_accepted"] - accepted
    assert sum(p - a for p, a in drafts.kept) == eng.stats()["draft_rejected"] - rejected
