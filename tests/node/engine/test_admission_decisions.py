"""admission.py and prefix_state.py alone: their decisions over a queue, active sequences and a
budget built by hand (no scheduler, no context, no model)."""

from __future__ import annotations

import itertools

import pytest

from node.engine import admission, prefix_state
from node.engine.budget import KVBudget
from node.engine.limits import SchedulerLimits
from node.engine.sequence import Channel, Phase, Sequence
from node.engine.types import BATCH, INTERACTIVE, GenerationRequest

_keys = itertools.count(1)


def seq(prompt: tuple[int, ...] = (1, 2, 3), *, priority: int = INTERACTIVE, group: int | None = None,
        max_tokens: int = 4, scope: str = "", max_wait_s: float = 0.0) -> Sequence:
    req = GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens, priority=priority, cache_scope=scope,
                            max_wait_s=max_wait_s)
    return Sequence(req, Channel(None), key=next(_keys), group=group if group is not None else next(_keys))


def limits(**kw: int) -> SchedulerLimits:
    return SchedulerLimits(n_parallel=2, max_queue=8, step_token_budget=8, **kw)


@pytest.mark.parametrize("free, interactive_slots, expect", [
    (2, 0, "batch"),   # nothing kept for live work: the batch head goes
    (2, 1, "batch"),   # more free than kept
    (1, 1, None),      # the last free slot is kept for live work
])
def test_a_batch_head_leaves_the_interactive_slots(free, interactive_slots, expect):
    budget = KVBudget(2, 100)
    budget.free_slots = budget.free_slots[:free]
    b = seq(priority=BATCH)
    got = admission.admission([b], [], budget, limits(interactive_slots=interactive_slots))
    assert (got.seq if got else None) is (b if expect else None)


def test_the_interactive_class_goes_first_and_a_group_holding_fewer_slots_before_one_holding_more():
    budget = KVBudget(4, 100)
    running = seq(group=7)
    running.phase = Phase.DECODE
    b, again, fresh = seq(priority=BATCH), seq(group=7), seq()
    assert admission.next_waiting([b, again, fresh], [running], budget, limits()) is fresh
    assert admission.next_waiting([again], [running], budget, limits(group_slots=1)) is None


def test_an_identical_prompt_being_prefilled_makes_a_follower_that_reserves_no_prompt_cells():
    budget = KVBudget(2, 11)  # 3 prompt cells + 4 own for the leader; a follower needs 4 only
    leader = seq()
    budget.take(leader, 4, None)
    leader.phase = Phase.PREFILL
    follower, stranger = seq(), seq(scope="other")
    got = admission.admission([follower], [leader], budget, limits())
    assert got is not None and got.leader is leader and got.own == 4
    assert admission.admission([stranger], [leader], budget, limits()) is None  # another tenant: no room


def test_a_late_fork_needs_a_member_holding_the_prompt_but_its_last_token():
    budget = KVBudget(2, 100)
    member = seq(group=3)
    budget.take(member, 5, None)
    member.phase, member.n_past = Phase.DECODE, 2
    fork = seq(group=3)
    got = admission.fork_admission(fork, [member], budget, limits(), lambda slot, n: True)
    assert got is not None and got.source is member and got.own == 4 + 0 + 1
    assert admission.fork_admission(fork, [member], budget, limits(), lambda slot, n: False) is None


def test_expiry_spares_the_waiting_members_of_a_served_request():
    running, waiting_member, late, patient = seq(group=5), seq(group=5, max_wait_s=1), seq(max_wait_s=1), seq()
    for s in (waiting_member, late, patient):
        s.t_wait = 0.0
    got = admission.expiry([waiting_member, late, patient], [running], now=10.0)
    assert got.serving == [waiting_member] and got.late == [late]


def test_a_freed_slot_keeps_what_its_kv_holds_unless_the_request_failed():
    s = seq()
    s.phase, s.n_past = Phase.DECODE, 9
    assert prefix_state.resident_tokens(s, "stop", True, pos_max=7) == 8
    assert prefix_state.resident_tokens(s, "error", True, pos_max=7) == 0
    assert prefix_state.resident_tokens(s, "stop", False, pos_max=7) == 0
    assert prefix_state.window_kept(4, pos_min=3, n_tokens=8) and not prefix_state.window_kept(4, pos_min=5, n_tokens=8)


def test_a_copy_of_a_kv_holds_the_window_only_where_the_source_has_not_moved_past_it():
    # a state leaves out the cells the source's own window left behind (at or before pos_max - n_swa)
    assert prefix_state.window_copied(0, pos_min=0, pos_max=900, n_tokens=10)  # no sliding window
    assert prefix_state.window_copied(512, pos_min=0, pos_max=64, n_tokens=44)  # all within one window
    assert prefix_state.window_copied(512, pos_min=0, pos_max=595, n_tokens=596)  # cut where the source ends
    assert not prefix_state.window_copied(512, pos_min=0, pos_max=620, n_tokens=596)  # moved past it
    assert not prefix_state.window_copied(512, pos_min=0, pos_max=600, n_tokens=44)
    assert not prefix_state.window_copied(512, pos_min=200, pos_max=700, n_tokens=701)  # cells reused already


def test_a_prompt_waits_for_a_leader_prefilling_its_document_as_urgent_as_itself():
    document = tuple(range(100, 200))
    wanted = lambda s: (32, 64, 96)  # noqa: E731  (the block boundaries the cache does not hold yet)
    leader = seq((*document, 1), priority=BATCH)
    leader.phase, leader.n_past = Phase.PREFILL, 40
    follower = seq((*document, 2), priority=BATCH)
    wait = admission.prefix_wait(follower, [leader], wanted, 64)
    assert wait is not None and wait.leader is leader and wait.boundary == 96
    # a live prompt does not wait for a batch one (which pauses while live requests run)
    assert admission.prefix_wait(seq((*document, 3)), [leader], wanted, 64) is None
    # nor where the leader is past the boundary, shares too little, or is another tenant's
    leader.n_past = 96
    assert admission.prefix_wait(follower, [leader], wanted, 64) is None
    leader.n_past = 40
    assert admission.prefix_wait(seq((*document[:50], 9), priority=BATCH), [leader], wanted, 64) is None
    assert admission.prefix_wait(seq((*document, 2), priority=BATCH, scope="t"), [leader], wanted, 64) is None


def test_a_prompt_sharing_a_short_prefix_waits_to_copy_it_where_the_cache_wants_no_boundary():
    instruction = tuple(range(100, 140))  # 40 tokens: no block boundary of the cache's inside
    leader = seq((*instruction, 1, 2))
    leader.phase, leader.n_past = Phase.PREFILL, 0
    follower = seq((*instruction, 3, 4))
    none = lambda s: ()  # noqa: E731
    wait = admission.prefix_wait(follower, [leader], none, 64, copy_tokens=32)
    assert wait is not None and wait.leader is leader and wait.boundary == 40 and not wait.store
    assert admission.prefix_wait(follower, [leader], none, 64, copy_tokens=0) is None  # copying off
    assert admission.prefix_wait(follower, [leader], none, 64, copy_tokens=41) is None  # shares too little
    # the copy leaves the prompt's last token to decode: a prompt that is all instruction waits for all but it
    whole = seq(instruction)
    assert admission.prefix_wait(whole, [leader], none, 64, copy_tokens=32).boundary == 39
    leader.n_past = 40  # the leader holds it: no wait, the follower copies at admission
    assert admission.prefix_wait(follower, [leader], none, 64, copy_tokens=32) is None
    # with a cache boundary inside the shared part, the copy takes it all (the boundary's state
    # only without copying)
    document = tuple(range(100, 200))
    cached = seq((*document, 1))
    cached.phase, cached.n_past = Phase.PREFILL, 10
    reader = seq((*document, 2))
    wait = admission.prefix_wait(reader, [cached], lambda s: (32, 64, 96), 64, copy_tokens=32)
    assert wait is not None and wait.boundary == 100 and not wait.store
    wait = admission.prefix_wait(reader, [cached], lambda s: (32, 64, 96), 64, copy_tokens=0)
    assert wait is not None and wait.boundary == 96 and wait.store


def test_a_new_prompt_copies_the_longest_prefix_an_active_kv_holds():
    instruction = tuple(range(100, 140))
    prefilling = seq((*instruction, 1, 2))
    prefilling.phase, prefilling.slot, prefilling.n_past = Phase.PREFILL, 0, 20  # holds 20 of the 40 so far
    decoding = seq((*instruction, 5))
    decoding.phase, decoding.slot = Phase.DECODE, 1
    decoding.tokens += [6, 7, 8]  # its answer: 6 and 7 are in its KV, 8 is sampled, not yet decoded
    decoding.n_past = 43
    usable = lambda slot, n: True  # noqa: E731
    # a turn that continues the decoding one's prompt and answer copies all of its KV
    turn = seq((*instruction, 5, 6, 7, 8, 9))
    got = admission.prefix_copy(turn, [prefilling, decoding], 0, usable, 32)
    assert got is not None and got.source is decoding and got.n_tokens == 43
    # another prompt over the instruction: the 40 tokens the decoding one holds, not the 20 of the other
    other = seq((*instruction, 9, 9))
    assert admission.prefix_copy(other, [prefilling, decoding], 0, usable, 32).n_tokens == 40
    # none where the slot keeps as much already, below the minimum, another tenant's, or the KV is cut
    assert admission.prefix_copy(other, [prefilling, decoding], 40, usable, 32) is None
    assert admission.prefix_copy(other, [prefilling, decoding], 0, usable, 41) is None
    assert admission.prefix_copy(seq((*instruction, 9), scope="t"), [prefilling, decoding], 0, usable, 32) is None
    assert admission.prefix_copy(other, [prefilling, decoding], 0, lambda slot, n: slot != 1, 32) is None
    # the prompt's last token is never copied: it is decoded for the prompt's own logits
    assert admission.prefix_copy(seq(instruction), [decoding], 0, usable, 32).n_tokens == 39
