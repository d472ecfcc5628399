"""Who takes a slot next, and who has waited too long: the scheduler's admission decisions.

The rules (the scheduler applies them each step, node/engine/scheduler.py):
- queued requests are admitted interactive ones first (`GenerationRequest.priority`; arrival
  order within a class), while a slot is free and the KV budget (budget.py) can hold what they
  may grow to: prompt + max_tokens (+ draft room). The head waits for room; nobody overtakes it;
- the sequences of one request (n, best_of, a Conclave) hold `group_slots` slots at most, and a
  request holding fewer slots is admitted before one holding more;
- a batch-priority request takes a slot only while more than `interactive_slots` are free, so
  a live request arriving during a batch finds a slot at once;
- a request whose prompt is identical to one being prefilled (same tenant) follows it: it
  reserves only its own max_tokens and is cloned from the leader when its prompt is complete;
- a request whose prompt shares a long prefix with one being prefilled (same tenant: the same
  document, another question) waits until the leader has computed it, at a block boundary the
  prefix cache wants for it (`prefix_wait`), and restores it from there: the batch computes a
  document sent four times at once once. Nobody overtakes it meanwhile; the wait is the
  leader's prefill of that prefix, which it would otherwise have shared the steps with;
- a request whose prompt shares at least `prefix_copy_tokens` leading tokens with an active
  sequence's KV (same tenant) starts from a copy of it (`prefix_copy`), and waits for one still
  prefilling them (`prefix_wait`) as above: four prompts over one instruction compute it once;
- a fork joining a group that is already decoding (a Conclave's later candidate) goes before
  the queue's head when a member still holds its prompt but the last token: it clones that and
  draws its cells from the group's spare reservation first;
- a request still waiting after its `max_wait_s` ends unstarted with a retry-after (the waiting
  members of a request that holds slots count their wait from its last step).

Every function here reads the queue, the active sequences and the budget and returns a
decision (`Admit`, `AdmitFork`, `Expiry`) or None; none changes them or touches the llama
context. `usable(slot, n)` is a read of the KV (whether a slot's KV cut at n tokens is whole).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping
from typing import Sequence as Sequence_

from node.engine.budget import KVBudget, common_prefix
from node.engine.limits import SchedulerLimits
from node.engine.sequence import Phase, Sequence
from node.engine.types import INTERACTIVE


@dataclass(frozen=True, slots=True)
class Admit:
    """Start `seq` with `own` cells of its own, prefilling its prompt or following `leader`."""

    seq: Sequence
    own: int
    leader: Sequence | None


@dataclass(frozen=True, slots=True)
class AdmitFork:
    """Start the fork `seq` with `own` cells, cloning its prompt but the last token from `source`."""

    seq: Sequence
    own: int
    source: Sequence


@dataclass(frozen=True, slots=True)
class PrefixWait:
    """`seq` waits for `leader` to compute its prompt up to `boundary`: the leader's state is
    stored there for it (`store`), or seq copies the leader's KV up to there at admission."""

    seq: Sequence
    leader: Sequence
    boundary: int
    store: bool = True


@dataclass(frozen=True, slots=True)
class PrefixCopy:
    """`seq` starts from `source`'s KV: its first `n_tokens` prompt tokens are there already."""

    source: Sequence
    n_tokens: int


@dataclass(frozen=True, slots=True)
class Expiry:
    """Waiting sequences whose request is being served (their wait restarts now), and the late
    ones, to end unstarted."""

    serving: list[Sequence]
    late: list[Sequence]


def held(active: Iterable[Sequence]) -> collections.Counter[int]:
    """Slots each group holds now."""
    return collections.Counter(seq.group for seq in active)


def room_for(seq: Sequence, holding: Mapping[int, int], limits: SchedulerLimits) -> bool:
    """Whether seq's group may take one more slot (a request holds `group_slots` at most)."""
    cap = limits.group_slots
    return cap <= 0 or holding.get(seq.group, 0) < cap


def next_waiting(queue: Iterable[Sequence], active: list[Sequence], budget: KVBudget,
                 limits: SchedulerLimits) -> Sequence | None:
    """The head of the queue: its first request of the most urgent class. A batch request only
    while more slots are free than `interactive_slots`; a request whose sequences hold
    `group_slots` slots already waits for one of them to end."""
    holding = held(active)
    eligible = [seq for seq in queue if room_for(seq, holding, limits)]
    if not eligible:
        return None
    # a request holding fewer slots goes first: one asking for many (n, best_of, a Conclave)
    # shares the slots with the others waiting instead of taking them in turn
    head = min(eligible, key=lambda seq: (seq.request.priority, holding[seq.group]))  # min keeps arrival order
    if head.request.priority > INTERACTIVE and len(budget.free_slots) <= limits.interactive_slots:
        return None
    return head


def admission(queue: Iterable[Sequence], active: list[Sequence], budget: KVBudget,
              limits: SchedulerLimits) -> Admit | None:
    """The queue's head if it may start now (None: nobody, or the head waits for room)."""
    seq = next_waiting(queue, active, budget, limits)
    if seq is None:
        return None
    leader = prefilling_leader(seq, active)
    prompt_cells = 0 if leader else len(seq.prompt)
    own = seq.request.max_tokens + limits.max_draft
    if not budget.fits(prompt_cells, own + seq.spare):
        return None  # the head waits for room, nobody overtakes it
    return Admit(seq, own, leader)


def prefix_wait(seq: Sequence, active: Iterable[Sequence], wanted: Callable[[Sequence], Sequence_[int]],
                min_tokens: int, copy_tokens: int = 0) -> PrefixWait | None:
    """Whether seq should wait for an active sequence prefilling a prompt that shares leading
    tokens with seq's (the same tenant, at least as urgent as seq). It waits when they share at
    least `copy_tokens` (0: never) and the leader is short of them: seq copies the leader's KV at
    admission (`prefix_copy`). Without copying, when they share at least `min_tokens` and the
    leader is short of the longest block boundary of the shared part the prefix cache wants
    for seq (`wanted`: seq's boundaries the cache does not hold yet): the leader's state is
    stored there, and seq restores it. None where no such leader is short of such a point (seq
    prefills on its own)."""
    floor = min((n for n in (min_tokens, copy_tokens) if n > 0), default=0)
    if floor == 0:
        return None
    best: Sequence | None = None
    shared = 0
    for other in active:
        if other.phase is not Phase.PREFILL or other.request.cache_scope != seq.request.cache_scope:
            continue
        if other.request.priority > seq.request.priority:
            continue  # a batch prompt pauses while live requests run: a live one does not wait for it
        common = common_prefix(other.prompt, seq.prompt)
        if common >= floor and common > shared:
            best, shared = other, common
    if best is None:
        return None
    target = min(shared, len(seq.prompt) - 1)  # seq decodes its last prompt token itself, for its logits
    if 0 < copy_tokens <= target and best.n_past < target:
        return PrefixWait(seq, best, target, store=False)  # a copy takes more than a boundary's state
    if min_tokens > 0 and shared >= min_tokens:
        ahead = [b for b in wanted(seq) if best.n_past < b <= shared and b >= min_tokens]
        if ahead:
            return PrefixWait(seq, best, max(ahead))
    return None


def prefix_copy(seq: Sequence, active: Iterable[Sequence], kept: int, usable: Callable[[int, int], bool],
                min_tokens: int) -> PrefixCopy | None:
    """The active sequence whose KV holds the longest leading part of seq's prompt (the same
    tenant; at least `min_tokens`, more than the `kept` tokens seq's slot holds already, and at
    most all but the prompt's last token), when `usable` says its KV cut there is whole. A
    sequence's KV holds its first `n_past` tokens, prompt then answer."""
    best: PrefixCopy | None = None
    limit = len(seq.prompt) - 1
    for other in active:
        if other is seq or other.slot < 0 or other.phase not in (Phase.PREFILL, Phase.DECODE) \
                or other.request.cache_scope != seq.request.cache_scope:
            continue
        n = min(common_prefix(other.tokens[:other.n_past], seq.prompt), limit)
        if n >= min_tokens and n > kept and (best is None or n > best.n_tokens) and usable(other.slot, n):
            best = PrefixCopy(other, n)
    return best


def prefilling_leader(seq: Sequence, active: Iterable[Sequence]) -> Sequence | None:
    """An active sequence prefilling seq's very prompt for the same tenant."""
    for other in active:
        if other.phase is Phase.PREFILL and other.prompt == seq.prompt \
                and other.request.cache_scope == seq.request.cache_scope:
            return other
    return None


def forks(queue: Iterable[Sequence]) -> list[Sequence]:
    """The waiting forks of running groups, in arrival order."""
    return [s for s in queue if s.fork]


def fork_admission(seq: Sequence, active: list[Sequence], budget: KVBudget, limits: SchedulerLimits,
                   usable: Callable[[int, int], bool]) -> AdmitFork | None:
    """Whether the fork seq may start now from a member of its group (None: not now, or not as a
    fork: with no member holding the prompt it is admitted as any request)."""
    if not room_for(seq, held(active), limits):
        return None
    source = fork_source(seq, active, usable)
    if source is None or source.share is None:
        return None
    own = seq.request.max_tokens + limits.max_draft + 1  # + the prompt's last token, decoded again
    if not budget.fits(0, max(0, own - source.share.spare)):
        return None
    return AdmitFork(seq, own, source)


def fork_source(seq: Sequence, active: Iterable[Sequence], usable: Callable[[int, int], bool]) -> Sequence | None:
    """A decoding member of seq's group whose KV still holds all of the prompt but its last token."""
    n = len(seq.prompt) - 1
    for other in active:
        if (other.group == seq.group and other.phase is Phase.DECODE and other.prompt == seq.prompt
                and other.n_past >= n and usable(other.slot, n)):
            return other
    return None


def expiry(queue: Iterable[Sequence], active: Iterable[Sequence], now: float) -> Expiry:
    """After admission: the waiting sequences of requests being served, and those whose
    `max_wait_s` has passed (counted from `t_wait`, which a served request's restart now)."""
    waiting = list(queue)
    serving_groups = {s.group for s in active}
    serving = [s for s in waiting if s.group in serving_groups]
    late = [s for s in waiting if s.group not in serving_groups and 0 < s.request.max_wait_s < now - s.t_wait]
    return Expiry(serving, late)


def retry_after(active: Iterable[Sequence], steps: float, step_ms: float, step_token_budget: int) -> int:
    """Seconds until the soonest running request must end (its max_tokens at the recent step time)."""
    step_s = step_ms / steps / 1000 if steps else 0.05
    left = min((s.tokens_left + s.prefill_left // max(1, step_token_budget)
                for s in active), default=0)
    return max(1, min(300, round(left * step_s)))
