"""A sequence's prefix states: what its slot keeps, what to restore, where and what to store.

- The slot: a new prompt takes the free slot whose resident KV holds the longest prefix of it
  (budget.py `choose`, only a slot its own tenant left), and keeps those tokens (`claim`); a
  freed slot keeps the tokens of its sequence the KV holds, unless the request failed
  (`resident_tokens`).
- Restore: the prefix cache (hooks.py `PrefixCacheHook`) is asked only for a longer prefix than
  the slot keeps; its state replaces the slot's KV (`restore`).
- Store: a prompt's chunks end on the block boundaries the cache does not hold yet, whose
  state is saved right after the step (`Restore.store_at`); a finished request asking for
  `store_final_state` saves prompt + answer at the longest boundary its KV completes
  (`final_boundary`). A sliding-window model's KV cut at n tokens is whole only while it still
  holds the window the token at n attends to (`window_kept`).

Each function reads the hook, the sequence and the budget and returns a decision; the
scheduler applies it to the llama context (state get/set, seq_rm) and checks the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from node.engine.budget import KVBudget
from node.engine.hooks import PrefixCacheHook
from node.engine.sequence import Phase, Sequence
from node.engine.types import FinishReason


@dataclass(frozen=True, slots=True)
class Claim:
    """The free slot a sequence takes and the leading tokens of its prompt the slot's KV keeps
    (the rest of that KV is to be removed)."""

    slot: int
    kept: int


@dataclass(frozen=True, slots=True)
class Restore:
    """A cached state to load into the sequence's slot (None: keep what the slot holds), the
    tokens it holds, and the prompt's block boundaries the cache still wants, ascending."""

    state: bytes | None
    n_tokens: int
    boundaries: tuple[int, ...]

    def store_at(self, n_past: int) -> list[int]:
        """The boundaries past the KV the sequence starts from: its chunks end there."""
        return [b for b in self.boundaries if b > n_past]


def claim(budget: KVBudget, prompt: tuple[int, ...] | None, resident: bool, usable: Callable[[int, int], bool],
          scope: str = "") -> Claim:
    """The slot for a sequence (prompt None: its KV comes from elsewhere, nothing to keep;
    `resident` False: residents are never continued)."""
    slot, kept = budget.choose(prompt if resident else None, usable, scope)
    return Claim(slot, kept)


def restore(hook: PrefixCacheHook, seq: Sequence) -> Restore:
    """What the cache offers seq beyond the `seq.n_past` tokens its slot keeps already."""
    kept, prompt, scope = seq.n_past, seq.prompt, seq.request.cache_scope
    hit = hook.lookup(prompt, scope, beyond=kept)
    boundaries = tuple(sorted(b for b in hook.boundaries_to_store(prompt, scope) if b < len(prompt)))
    if hit is not None and kept < hit[0] < len(prompt):
        return Restore(hit[1], hit[0], boundaries)
    return Restore(None, 0, boundaries)


def final_boundary(hook: PrefixCacheHook, seq: Sequence) -> int | None:
    """The longest boundary of a finished sequence's prompt + answer the cache wants, within the
    `seq.n_past` tokens its KV holds (the last sampled token was never decoded); None: none."""
    n_kv = seq.n_past
    # a prompt's boundaries stop one token short of it: offer the token after the KV too
    wanted = [b for b in hook.boundaries_to_store(seq.tokens[:n_kv + 1], seq.request.cache_scope) if 0 < b <= n_kv]
    return max(wanted) if wanted else None


def resident_tokens(seq: Sequence, reason: FinishReason, resident: bool, pos_max: int) -> int:
    """How many of seq's tokens its freed slot keeps resident (0: the KV goes): what the KV holds
    of them, unless the request failed, when what the KV holds is not known."""
    if resident and reason != "error" and seq.phase in (Phase.PREFILL, Phase.DECODE):
        return min(seq.n_past, pos_max + 1)
    return 0


def window_kept(n_swa: int, pos_min: int, n_tokens: int) -> bool:
    """Whether a KV whose smallest position is `pos_min` holds every position the token at
    `n_tokens` attends to (n_swa: the model's sliding window, 0: none)."""
    return n_swa == 0 or pos_min <= max(0, n_tokens - n_swa)


def window_copied(n_swa: int, pos_min: int, pos_max: int, n_tokens: int) -> bool:
    """Whether a copy of a KV holding positions pos_min..pos_max (`state_copy`), cut at
    `n_tokens`, holds every position the token at `n_tokens` attends to. llama.cpp writes a
    sequence's state without the cells its own sliding window has left behind (those at or
    before pos_max - n_swa), so the copy holds the window before n only where the source has
    not moved past it (n_swa: the model's sliding window, 0: none)."""
    return window_kept(n_swa, max(pos_min, pos_max - n_swa + 1), n_tokens)
