"""What other parts of the node plug into the scheduler: the prefix KV cache and drafts.

Both are called on the engine thread, between two decode steps, so they must return
fast (no network round trips: a remote tier is fetched ahead of time by its owner).
An exception from a hook is logged and treated as "nothing to offer"; it never ends a
request.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class PrefixCacheHook(Protocol):
    def lookup(self, prompt_tokens: Sequence[int]) -> tuple[int, bytes] | None:
        """Longest cached block boundary that is a prefix of the prompt: (n_tokens, state)."""

    def boundaries_to_store(self, prompt_tokens: Sequence[int]) -> Sequence[int]:
        """Token counts (block boundaries <= len(prompt)-1) whose state is not stored yet."""

    def store(self, prompt_tokens: Sequence[int], n_tokens: int, state: bytes) -> None:
        """Called right after the KV of prompt_tokens[:n_tokens] is complete; must return fast.

        For a request with `store_final_state`, also once at its end: `prompt_tokens` are
        then the prompt and the generated tokens whose KV is complete, and `n_tokens` the
        longest boundary of them that `boundaries_to_store` offered.
        """


@runtime_checkable
class DraftProposer(Protocol):
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Sequence[int]:
        """Up to max_tokens tokens likely to follow `tokens` (prompt + generated so far).

        The scheduler appends them after the sequence's next token in the same batch,
        with logits on each, and keeps the longest prefix its own sampler agrees with,
        so output is exactly what plain decoding would give (greedy: identical text).
        A proposer may also define `record(proposed: int, accepted: int)`: the scheduler
        then reports, after each verify, how many of the drafts it kept (to steer draft
        length by measured acceptance).
        """
