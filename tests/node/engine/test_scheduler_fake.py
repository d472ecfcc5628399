"""The scheduler alone, step by step with no thread, over the fake llama (fake_llama.py).

These tests stand for the scheduler layer only: the model is a fake (scripted next tokens,
a KV that checks positions), everything else is the real scheduler, budget, sequences,
samplers and verification. What needs real logits is tested against Gemma elsewhere.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

import pytest

from node.engine.hooks import PROMPT_SHARE, Draft, DraftAsk, DraftSeq, StepPlan
from node.engine.limits import SchedulerLimits
from node.engine.scheduler import Scheduler
from node.engine.sequence import Channel, Phase, Sequence
from node.engine.types import BATCH, INTERACTIVE, Finished, GenerationRequest, SamplingParams, TextDelta
from tests.node.engine.fake_llama import BOS, FakeContext, FakeModel, after, letter

GREEDY = SamplingParams(temperature=0.0)
_keys = itertools.count(1)


def make(limits: SchedulerLimits | None = None, *, speculator: object = None,
         **ctx: object) -> tuple[Scheduler, FakeContext]:
    model = FakeModel()
    fake = FakeContext(model, **ctx)  # type: ignore[arg-type]
    limits = limits or SchedulerLimits(n_parallel=fake.n_seq_max, max_queue=16, step_token_budget=8)
    return Scheduler(model, fake, limits, speculator=speculator), fake  # type: ignore[arg-type]


def request(prompt: str, max_tokens: int = 4, **kw: object) -> GenerationRequest:
    tokens = (BOS, *(letter(w) for w in prompt.split()))
    return GenerationRequest(prompt_tokens=tokens, max_tokens=max_tokens, sampling=GREEDY,
                             **kw)  # type: ignore[arg-type]


def seqs(req: GenerationRequest, n: int = 1, *, group: int | None = None, fork: bool = False) -> list[Sequence]:
    group = group if group is not None else next(_keys)
    return [Sequence(req, Channel(None), seed=1, key=next(_keys), group=group, fork=fork or (i > 0 and fork))
            for i in range(n)]


def finished(seq: Sequence) -> Finished | None:
    """The Finished event of seq, once it has one (the channel's events are kept for text())."""
    events = _events(seq)
    return next((e for e in events if isinstance(e, Finished)), None)


_EVENTS: dict[int, tuple[Sequence, list]] = {}  # the sequence is kept too, so its id is never reused


def _events(seq: Sequence) -> list:
    got = _EVENTS.setdefault(id(seq), (seq, []))[1]
    while True:
        try:
            got.append(seq.channel.get_sync(timeout=0))
        except Exception:
            return got


def text(seq: Sequence) -> str:
    return "".join(e.text for e in _events(seq) if isinstance(e, TextDelta))


def run(sched: Scheduler, *watch: Sequence, steps: int = 200) -> None:
    """Step until every watched sequence has finished."""
    for _ in range(steps):
        if all(finished(s) is not None for s in watch):
            return
        sched.step()
    raise AssertionError(f"not finished after {steps} steps: {[s.phase for s in watch]}")


def letters(start: str, n: int) -> str:
    """What the default script generates after a context ending in `start`."""
    out, token = [], letter(start)
    for _ in range(n):
        token = after([token])
        out.append(" " + chr(ord("a") + token - 2))
    return "".join(out)


# -- basics ------------------------------------------------------------------------------------


def test_a_request_generates_the_scripted_tokens_and_frees_its_slot():
    sched, fake = make()
    [seq] = seqs(request("a b c", max_tokens=4))
    sched.enqueue([seq])
    run(sched, seq)
    assert finished(seq).reason == "length" and text(seq) == letters("c", 4) == " d e f g"
    assert sched.stats()["slots_free"] == 4 and sched.stats()["active"] == 0
    assert sched.step() is False  # nothing left to decode


def test_the_end_of_generation_token_stops_a_request():
    sched, fake = make()
    [seq] = seqs(request("a b", max_tokens=8))
    fake.next_token = lambda ctx: 1 if len(ctx) >= 5 else after(ctx)  # EOS once the KV holds 5 tokens
    sched.enqueue([seq])
    run(sched, seq)
    assert finished(seq).reason == "stop" and text(seq) == " c d"


# -- admission classes ------------------------------------------------------------------------


def test_interactive_requests_are_admitted_before_batch_ones_in_arrival_order_within_a_class():
    sched, _ = make(SchedulerLimits(n_parallel=1, max_queue=16, step_token_budget=8))
    b1, = seqs(request("a", priority=BATCH))
    i1, = seqs(request("b"))
    b2, = seqs(request("c", priority=BATCH))
    i2, = seqs(request("d"))
    sched.enqueue([b1, i1, b2, i2])
    order = []
    for _ in range(200):
        for s in (b1, i1, b2, i2):
            if s.phase is not Phase.WAITING and s not in order:
                order.append(s)
        if len(order) == 4:
            break
        sched.step()
    assert order == [i1, i2, b1, b2]


def test_batch_work_leaves_the_interactive_slots_free():
    sched, _ = make(SchedulerLimits(n_parallel=3, max_queue=16, step_token_budget=8, interactive_slots=1))
    batch = [s for i in range(3) for s in seqs(request("a b", max_tokens=6, priority=BATCH))]
    sched.enqueue(batch)
    sched.step()
    assert [s.phase is Phase.WAITING for s in batch] == [False, False, True]  # one of the three slots stays free
    live, = seqs(request("c", max_tokens=2))
    sched.enqueue([live])
    sched.step()
    assert live.phase is not Phase.WAITING  # a live arrival finds its slot at once
    run(sched, live, *batch)
    assert all(finished(s).reason == "length" for s in [live, *batch])


def test_a_request_waits_for_kv_room_and_nobody_overtakes_the_head():
    # 40 cells: the first request reserves 3 + 20, the second needs 3 + 20 more: it waits
    sched, _ = make(SchedulerLimits(n_parallel=4, max_queue=16, step_token_budget=8), n_ctx=40)
    first, = seqs(request("a b", max_tokens=20))
    second, = seqs(request("c d", max_tokens=20))
    small, = seqs(request("e", max_tokens=2))  # would fit, but the head waits first
    sched.enqueue([first, second, small])
    sched.step()
    assert first.phase is not Phase.WAITING
    assert second.phase is Phase.WAITING and small.phase is Phase.WAITING
    run(sched, first)
    run(sched, second, small)
    assert finished(second).reason == "length" and finished(small).reason == "length"


def test_a_request_holding_fewer_slots_goes_first_and_a_group_holds_at_most_group_slots():
    sched, _ = make(SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=8, group_slots=1))
    many = seqs(request("a b", max_tokens=3), 3)
    other, = seqs(request("c", max_tokens=3))
    sched.enqueue([*many, other])
    sched.step()
    assert sum(s.phase is not Phase.WAITING for s in many) == 1 and other.phase is not Phase.WAITING
    run(sched, *many, other)
    assert all(finished(s).reason == "length" for s in [*many, other])


def test_a_request_still_waiting_after_max_wait_s_ends_unstarted_with_a_retry_after():
    sched, _ = make(SchedulerLimits(n_parallel=1, max_queue=16, step_token_budget=8))
    running, = seqs(request("a", max_tokens=30))
    late, = seqs(request("b", max_tokens=2, max_wait_s=0.01))
    patient, = seqs(request("c", max_tokens=2))
    sched.enqueue([running, late, patient])
    sched.step()
    time.sleep(0.02)
    sched.step()
    done = finished(late)
    assert done is not None and done.reason == "error" and done.retry_after_s >= 1 and done.completion_tokens == 0
    assert finished(patient) is None and patient.phase is Phase.WAITING
    run(sched, running, patient)


# -- followers, hand-over, late forks ---------------------------------------------------------


LONG = "a b c d e f g h i j k l m n o p q r s t"  # 21 tokens with BOS: three chunks of 8


def test_an_identical_prompt_follows_the_prefilling_leader_and_is_cloned_when_its_prompt_is_done():
    sched, fake = make(n_batch=8)  # a step holds 8 tokens: the prompt takes three
    leader, = seqs(request(LONG, max_tokens=3))
    follower, = seqs(request(LONG, max_tokens=3))
    sched.enqueue([leader, follower])
    sched.step()
    assert follower.phase is Phase.FOLLOWER and follower.leader is leader and leader.n_past == 8
    assert fake.tokens_of(follower.slot) == []
    run(sched, leader, follower)
    assert text(leader) == text(follower) == " u v w"
    assert fake.decoded(letter("a")) == 1  # the prompt was prefilled once
    assert sched.counters["shared_prefills"] == 1


def test_a_leader_ending_mid_prefill_hands_its_kv_to_its_first_follower():
    sched, fake = make(n_batch=8)
    leader, = seqs(request(LONG, max_tokens=3))
    f1, = seqs(request(LONG, max_tokens=3))
    f2, = seqs(request(LONG, max_tokens=3))
    sched.enqueue([leader, f1, f2])
    sched.step()
    assert f1.phase is f2.phase is Phase.FOLLOWER
    done_before = leader.n_past
    leader.channel.cancelled = True
    sched.step()
    assert finished(leader).reason == "cancelled"
    assert f1.phase is Phase.PREFILL and f1.n_past == done_before + 8 and f1.leader is None
    assert f2.phase is Phase.FOLLOWER and f2.leader is f1 and f1.followers == [f2]
    run(sched, f1, f2)
    assert text(f1) == text(f2) == " u v w"
    assert fake.decoded(letter("a")) == 1  # the heir went on from the leader's KV, nothing prefilled twice


def test_a_late_fork_of_a_decoding_group_clones_the_prompt_and_decodes_only_its_last_token():
    sched, fake = make()
    first, = seqs(request(LONG, max_tokens=6))
    sched.enqueue([first])
    while first.phase is not Phase.DECODE:
        sched.step()
    sched.step()
    fork, = seqs(request(LONG, max_tokens=3), group=first.group, fork=True)
    sched.enqueue([fork])
    sched.step()
    assert sched.counters["forked_late"] == 1
    run(sched, first, fork)
    assert text(fork) == " u v w" and text(first) == " u v w x y z"
    assert fake.decoded(letter("a")) == 1 and fake.decoded(letter("t")) == 2  # the last prompt token, again


def test_a_fork_whose_group_holds_the_prompt_no_more_is_admitted_as_any_request():
    sched, fake = make()
    first, = seqs(request("a b c", max_tokens=2))
    sched.enqueue([first])
    run(sched, first)
    fork, = seqs(request("a b c", max_tokens=2), group=first.group, fork=True)
    sched.enqueue([fork])
    run(sched, fork)
    assert sched.counters["forked_late"] == 0 and text(fork) == " d e"


# -- decode failures ---------------------------------------------------------------------------


def test_a_decode_failing_for_one_sequence_ends_only_that_one_and_the_others_go_on():
    sched, fake = make(poison={letter("z")})
    good = [s for p in ("a b", "c d", "e f") for s in seqs(request(p, max_tokens=4))]
    bad, = seqs(request("x z", max_tokens=4))
    sched.enqueue([good[0], bad, good[1], good[2]])
    run(sched, bad, *good)
    assert finished(bad).reason == "error" and "llama_decode failed" in finished(bad).error
    assert [text(s) for s in good] == [" c d e f", " e f g h", " g h i j"]
    assert all(finished(s).reason == "length" for s in good)
    assert fake.failed >= 2  # the whole batch, then halves until the failing one was alone
    assert sched.stats()["slots_free"] == 4


def test_a_sequence_failing_while_decoding_ends_alone():
    sched, fake = make()
    a, = seqs(request("a", max_tokens=8))
    b, = seqs(request("m", max_tokens=8))
    sched.enqueue([a, b])
    for _ in range(3):
        sched.step()
    fake.poison = {letter("f")}  # a's next decode carries " f"
    run(sched, a, b)
    assert finished(a).reason == "error" and text(a).startswith(" b c d")
    assert finished(b).reason == "length" and text(b) == letters("m", 8)


# -- draft verification ------------------------------------------------------------------------


@dataclass
class ScriptedSpeculator:
    """A draft source for the test: proposes `k` tokens, the first `right` of them what the
    script will choose and the rest wrong; records what the engine tells it."""

    k: int
    right: int
    verified_calls: list[tuple[int, int]] = field(default_factory=list)
    begun: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    steps: int = 0
    plans: list[tuple[int | None, tuple[int, ...]]] = field(default_factory=list)  # (draining, asks' left)
    refills: list[float] = field(default_factory=list)

    def calibrate(self, measure: Callable[[int, int], float | None],
                  attend: Callable[[int, int], float | None]) -> None:
        pass

    def calibration_due(self) -> bool:
        return False

    def begin(self, seq: DraftSeq) -> None:
        self.begun.append(seq.key)

    def plan(self, n_decoding: int, asks: Seq[DraftAsk], prefill: int, budget: int, draining=None, refill=0.0) -> StepPlan:
        self.plans.append((draining, tuple(ask.left for ask in asks)))
        self.refills.append(refill)
        drafts = {}
        for ask in asks:
            tokens, last = [], ask.context[-1]
            for i in range(min(self.k, ask.room)):
                last = after([last]) if i < self.right else BOS
                tokens.append(last)
            drafts[ask.seq.key] = Draft(tuple(tokens), "scripted")
        return StepPlan(drafts, prefill)

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        self.verified_calls.append((len(draft.tokens), accepted))

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float, spans=()) -> None:
        self.steps += 1

    def end(self, seq: DraftSeq, tokens: Seq[int]) -> None:
        self.ended.append(seq.key)


@pytest.mark.parametrize("right, accepted_each", [(3, 3), (1, 1), (0, 0)], ids=["all", "some", "none"])
def test_drafts_are_verified_keeping_the_tokens_the_target_agrees_with(right, accepted_each):
    spec = ScriptedSpeculator(k=3, right=right)
    limits = SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=3)
    sched, fake = make(limits, speculator=spec)
    seq, = seqs(request("a b", max_tokens=9))
    sched.enqueue([seq])
    run(sched, seq)
    assert text(seq) == letters("b", 9) and finished(seq).reason == "length"  # drafts never change the text
    assert spec.begun == spec.ended == [seq.key]
    assert spec.verified_calls and all(acc == min(accepted_each, n) for n, acc in spec.verified_calls)
    assert sched.counters["draft_accepted"] == sum(acc for _, acc in spec.verified_calls)
    rejected = sum(n - acc for n, acc in spec.verified_calls)
    assert sched.counters["draft_rejected"] >= rejected - 1  # the draft that ends the sequence is cut by its end
    if right == 3:
        assert len(fake.decodes) < 1 + 9  # fewer steps than tokens
    if right == 0:
        assert len(fake.decodes) == 1 + 9 - 1  # the prompt, then one token a step (the last sampled is not decoded)
    # the request's own count of its decode steps: every decode after the prompt's, fewer than
    # its tokens after the first by what the kept drafts saved
    assert finished(seq).steps == len(fake.decodes) - 1
    assert finished(seq).steps == 9 - 1 - sched.counters["draft_accepted"]


def test_a_prompt_s_last_step_verifies_a_draft_of_its_answer():
    """The step that computes a prompt's last token also carries a draft of what follows it
    (the prompt's rest is decoded as the sequence's pending tokens, `_prompt_tail`): the
    answer's first token and the draft tokens it agrees with come out of the prompt's step."""
    spec = ScriptedSpeculator(k=3, right=3)
    limits = SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=3)
    sched, fake = make(limits, speculator=spec)
    seq, = seqs(request("a b", max_tokens=9))
    sched.enqueue([seq])
    sched.step()
    prompt = len(seq.prompt)
    assert [r.pos for r in fake.decodes[0] if r.seq == seq.slot] == list(range(prompt + 3))  # the prompt, 3 drafted
    assert len(seq.generated) == 4 and spec.verified_calls == [(3, 3)]
    assert sched.counters["prefill_tokens"] == prompt and seq.t_prompt_done > 0
    run(sched, seq)
    assert text(seq) == letters("b", 9) and finished(seq).steps == len(fake.decodes) - 1


def test_a_seeded_sampled_prompt_is_prefilled_and_drafts_from_its_first_token_on():
    """A seeded sampled request's prompt is computed as before, its first token sampled at its
    end, and drafts come from the next step on: its seed is to give plain decoding's text, and
    the prompt's KV computed in a batch whose size follows a draft moves the kernels' sums. An
    unseeded one drafts in its prompt's step as a greedy one does."""
    for seed, drafted_in_prompt_step in ((7, False), (None, True)):
        spec = ScriptedSpeculator(k=3, right=3)
        limits = SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=3)
        sched, fake = make(limits, speculator=spec)
        sampled = SamplingParams(temperature=0.8, seed=seed)
        req = GenerationRequest(prompt_tokens=(BOS, letter("a"), letter("b")), max_tokens=9, sampling=sampled)
        seq, = seqs(req)
        sched.enqueue([seq])
        sched.step()
        rows = [r.pos for r in fake.decodes[0] if r.seq == seq.slot]
        assert (len(rows) > len(seq.prompt)) == drafted_in_prompt_step, (seed, rows)
        run(sched, seq)
        assert finished(seq).reason == "length"


def test_drafting_for_a_request_that_asks_for_no_speculation_is_off():
    spec = ScriptedSpeculator(k=3, right=3)
    limits = SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=3)
    sched, _ = make(limits, speculator=spec)
    seq, = seqs(request("a b", max_tokens=5, speculation=False))
    sched.enqueue([seq])
    run(sched, seq)
    assert text(seq) == letters("b", 5) and not spec.begun and not spec.verified_calls


def test_the_planner_hears_when_the_batch_drains_and_who_bounds_it():
    """While a request waits for a slot, `draining` is None; once none waits it is the most
    tokens a sequence without drafts may still generate, and each ask says its own."""
    spec = ScriptedSpeculator(k=2, right=0)
    limits = SchedulerLimits(n_parallel=1, max_queue=16, step_token_budget=16, max_draft=2)
    sched, _ = make(limits, speculator=spec)
    first, = seqs(request("a b", max_tokens=4))
    second, = seqs(request("c d", max_tokens=5))
    sched.enqueue([first, second])
    run(sched, first, second)
    # each asks in its prompt's own step too (the prompt's rest is its pending tokens, nothing
    # sampled yet); an ask needs room for a draft before its last token, so the last step of
    # each asks nothing (and then counts as drafting nothing: the batch lasts at least its one
    # token more)
    assert spec.plans == [(None, (4,)), (None, (3,)), (None, (2,)), (None, ()),  # the second waits for the slot
                          (0, (5,)), (0, (4,)), (0, (3,)), (0, (2,)), (1, ())]  # the second alone

    spec = ScriptedSpeculator(k=2, right=0)
    sched, _ = make(SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=2), speculator=spec)
    plain, = seqs(request("a b", max_tokens=9, speculation=False))
    drafting, = seqs(request("c d", max_tokens=5))
    sched.enqueue([plain, drafting])
    run(sched, plain, drafting)
    # the plain one bounds the batch: 9 tokens, 1 sampled at the end of its prompt (while its
    # prompt is prefilled, the batch is joining: None)
    assert spec.plans == [(None, (5,)), (8, (4,)), (7, (3,)), (6, (2,)), (5, ()), (4, ()), (3, ()), (2, ()),
                          (1, ())]

    # a vote's candidate may be ended by its vote at any step, so one that drafts nothing does not
    # bound the batch either (its planned counterpart: node/speculative/draining.py's `voted`)
    spec = ScriptedSpeculator(k=2, right=0)
    sched, _ = make(SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=2), speculator=spec)
    candidate, = seqs(request("a b", max_tokens=9, speculation=False, voted=True))
    drafting, = seqs(request("c d", max_tokens=5))
    sched.enqueue([candidate, drafting])
    run(sched, candidate, drafting)
    assert spec.plans == [(None, (5,)), (0, (4,)), (0, (3,)), (0, (2,)), (1, ()),  # the drafting one's last token
                          (0, ()), (0, ()), (0, ()), (0, ())]  # the candidate alone


# -- prefix states and resident slots ----------------------------------------------------------


@dataclass
class BlockCache:
    """A prefix cache for the test: every `block` tokens of a prompt is a boundary, states in a dict."""

    block: int = 4
    states: dict[tuple[str, tuple[int, ...]], bytes] = field(default_factory=dict)

    def lookup(self, prompt_tokens: Seq[int], scope: str = "", beyond: int = 0) -> tuple[int, bytes] | None:
        for n in range(len(prompt_tokens) - 1, beyond, -1):
            state = self.states.get((scope, tuple(prompt_tokens[:n])))
            if state is not None:
                return n, state
        return None

    def boundaries_to_store(self, prompt_tokens: Seq[int], scope: str = "") -> Seq[int]:
        return [n for n in range(self.block, len(prompt_tokens), self.block)
                if (scope, tuple(prompt_tokens[:n])) not in self.states]

    def store(self, prompt_tokens: Seq[int], n_tokens: int, state: bytes, scope: str = "") -> None:
        self.states[(scope, tuple(prompt_tokens[:n_tokens]))] = state


def test_prefix_states_are_stored_at_block_boundaries_and_restored_for_the_next_prompt():
    cache = BlockCache()
    model = FakeModel()
    fake = FakeContext(model)
    limits = SchedulerLimits(n_parallel=2, max_queue=8, step_token_budget=8, resident=False)
    sched = Scheduler(model, fake, limits, prefix_cache=cache)  # type: ignore[arg-type]
    first, = seqs(request("a b c d e f g h i j", max_tokens=2, store_final_state=True))
    sched.enqueue([first])
    run(sched, first)
    assert sorted(n for _, p in cache.states for n in [len(p)]) == [4, 8, 12]  # two in the prompt, one at the end
    assert sched.counters["final_states_stored"] == 1
    second, = seqs(request("a b c d e f g h i j k l m", max_tokens=2))
    sched.enqueue([second])
    run(sched, second)
    # the answer was " k l": the state at 12 (prompt + answer) is the longest prefix of this prompt
    assert finished(second).cached_tokens == 12 and text(second) == " n o"
    assert sched.counters["prefix_tokens_restored"] == 12
    other, = seqs(request("a b c d e f g h i j", max_tokens=2, cache_scope="tenant"))
    sched.enqueue([other])
    run(sched, other)
    assert finished(other).cached_tokens == 0  # another tenant's states are not found


def test_prompts_sharing_a_document_sent_at_once_compute_it_once():
    """Three prompts share a 20-token document and differ after it, sent together: the first
    prefills the document, the others wait (nobody overtakes them) until its state is stored at
    the document's last block boundary, restore it and prefill only their own tail. Without
    the wait each would prefill all of it, side by side."""
    def serve(wait_tokens: int) -> tuple[Scheduler, list[Sequence]]:
        cache = BlockCache()
        model = FakeModel()
        fake = FakeContext(model)
        limits = SchedulerLimits(n_parallel=4, max_queue=8, step_token_budget=8, resident=False,
                                 prefix_wait_tokens=wait_tokens)
        sched = Scheduler(model, fake, limits, prefix_cache=cache)  # type: ignore[arg-type]
        document = " ".join("abcdefghijklmnopqrst")  # 20 tokens, 21 with BOS
        started = [s for tail in ("x", "y z", "z") for s in seqs(request(f"{document} {tail}", max_tokens=2))]
        sched.enqueue(started)
        run(sched, *started)
        return sched, started

    shared, (first, second, third) = serve(wait_tokens=8)
    assert shared.counters["prefix_waits"] == 1  # the second asked the first to store at 20; the third found it
    assert finished(first).cached_tokens == 0
    assert finished(second).cached_tokens == finished(third).cached_tokens == 20
    assert shared.counters["prefill_tokens"] == 22 + 3 + 2  # the document once, then each one's tail
    apart, plain = serve(wait_tokens=0)
    assert apart.counters["prefix_waits"] == 0 and apart.counters["prefill_tokens"] > 60
    assert [text(s) for s in plain] == [text(first), text(second), text(third)]


def test_a_new_prompt_takes_the_free_slot_whose_kv_holds_its_longest_prefix():
    sched, fake = make(SchedulerLimits(n_parallel=2, max_queue=8, step_token_budget=64))
    shared = " ".join("abcdefghijklmnopqrstuvwxyz"[i % 26] for i in range(40))  # 41 tokens with BOS
    first, = seqs(request(shared + " a", max_tokens=2))
    sched.enqueue([first])
    run(sched, first)
    second, = seqs(request(shared + " b", max_tokens=2))
    sched.enqueue([second])
    run(sched, second)
    assert sched.counters["resident_hits"] == 1 and finished(second).cached_tokens == 41
    assert text(second) == " c d"
    stranger, = seqs(request(shared + " c", max_tokens=2, cache_scope="tenant"))
    sched.enqueue([stranger])
    run(sched, stranger)
    assert sched.counters["resident_hits"] == 1 and finished(stranger).cached_tokens == 0


def test_the_prompt_tokens_beside_decoding_are_what_the_planner_grants():
    """A planner that grants prompts the least the protocol lets it (PROMPT_SHARE of the
    budget): no step carries more of the prompt, its last tokens (decoded as pending ones,
    `_prompt_tail`) included."""
    @dataclass
    class Stingy(ScriptedSpeculator):
        def plan(self, n_decoding: int, asks: Seq[DraftAsk], prefill: int, budget: int, draining=None, refill=0.0) -> StepPlan:
            return StepPlan({}, min(prefill, int(budget * PROMPT_SHARE)))

    limits = SchedulerLimits(n_parallel=2, max_queue=16, step_token_budget=16, max_draft=3)
    sched, fake = make(limits, speculator=Stingy(k=0, right=0))
    first, = seqs(request("a", max_tokens=12))
    sched.enqueue([first])
    sched.step()
    sched.step()
    second, = seqs(request(LONG, max_tokens=2))
    sched.enqueue([second])
    sched.step()
    slot = second.slot
    run(sched, first, second)
    chunks = [sum(1 for r in rows if r.seq == slot and r.pos < len(second.prompt)) for rows in fake.decodes]
    granted = int((16 - 1) * PROMPT_SHARE)  # the budget beside the first request's token
    assert max(chunks) == granted and sum(chunks) == len(second.prompt)  # never more prompt tokens than granted
    assert text(second) == " u v" and text(first) == letters("a", 12)


def test_prompts_sharing_an_instruction_sent_at_once_copy_it_from_the_first():
    """Three prompts share a 20-token instruction and differ after it, sent together, with no
    prefix cache: the first prefills the instruction, the others wait for it (admission.py
    `prefix_wait`, a copy wait), then start from a copy of its KV and prefill only their own
    tail. A fourth, sent while the others decode, copies from one of them. Without copying
    each prefills all of it; the outputs are the same."""
    instruction = " ".join("abcdefghijklmnopqrst")  # 20 tokens, 21 with BOS

    def serve(copy_tokens: int) -> tuple[Scheduler, list[Sequence]]:
        limits = SchedulerLimits(n_parallel=4, max_queue=8, step_token_budget=64, prefix_copy_tokens=copy_tokens)
        sched, fake = make(limits)
        started = [s for tail in ("x", "y z", "z") for s in seqs(request(f"{instruction} {tail}", max_tokens=6))]
        sched.enqueue(started)
        for _ in range(4):
            sched.step()
        assert all(s.phase is Phase.DECODE for s in started)
        late, = seqs(request(f"{instruction} w", max_tokens=2))
        sched.enqueue([late])
        run(sched, *started, late)
        return sched, [*started, late]

    shared, copied = serve(copy_tokens=8)
    assert shared.counters["prefix_waits"] == 1  # the second waited; the third, behind it, found it held
    assert shared.counters["prefix_copies"] == 3 and shared.counters["prefix_copied_tokens"] == 3 * 21
    assert [finished(s).cached_tokens for s in copied] == [0, 21, 21, 21]
    assert shared.counters["prefill_tokens"] == 22 + 2 + 1 + 1  # the instruction once, then each one's tail
    apart, plain = serve(copy_tokens=0)
    assert apart.counters["prefix_copies"] == apart.counters["prefix_waits"] == 0
    assert apart.counters["prefill_tokens"] == 22 + 23 + 22 + 22
    assert [text(s) for s in plain] == [text(s) for s in copied]


def test_the_scheduler_learns_whether_freed_slots_are_taken_again_at_once():
    """Clients that send their next request as each answer comes (a closed loop) fill each slot
    that frees while the batch goes on; requests sent in rounds leave the slots the first answers
    free to the next round. The planner is told which (`Speculator.plan`'s `refill`)."""
    spec = ScriptedSpeculator(k=1, right=1)
    sched, _ = make(SchedulerLimits(n_parallel=4, max_queue=16, step_token_budget=16, max_draft=1), speculator=spec)
    for _ in range(3):  # requests in rounds: all four at once, the next four after the last answer
        batch = [seqs(request("a b", max_tokens=2 + i))[0] for i in range(4)]
        sched.enqueue(batch)
        run(sched, *batch)
    assert sched.stats()["slot_refill"] == 0.0  # nine slots freed mid-batch, none taken
    assert set(spec.refills) == {0.0}
    clients = [seqs(request("a c", max_tokens=2 + i))[0] for i in range(3)]
    sched.enqueue(clients)
    for _ in range(30):  # each answer brings its client's next request, the batch never empties
        sched.step()
        for i, seq in enumerate(clients):
            if finished(seq) is not None:
                clients[i] = seqs(request("a c", max_tokens=2 + i))[0]
                sched.enqueue([clients[i]])
    assert sched.stats()["slot_refill"] > 0.5 and spec.refills[-1] > 0.5
