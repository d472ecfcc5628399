"""What other parts of the node plug into the scheduler: the prefix KV cache and drafts.

Both are called on the engine thread, between two decode steps, so they must return
fast (no network round trips: a remote tier is fetched ahead of time by its owner).
An exception from a hook is logged and treated as "nothing to offer"; it never ends a
request.

Drafts: a `Speculator` (node/speculative/controller.py is the node's own) is told when a
sequence begins and ends, plans each step as a whole (`plan`: given every decoding
sequence's room for drafts, the prompt tokens waiting to be prefilled beside them and the
step's token budget, it returns the drafts to verify and how many prompt tokens the step
carries), and hears back how many of each draft's tokens the target kept
(node/engine/verify.py) and what each step cost. It decides the draft lengths and the
split of the step between drafts and prefill; the engine only verifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from node.engine.types import SamplingParams


@runtime_checkable
class PrefixCacheHook(Protocol):
    # `scope` is the request's tenant (GenerationRequest.cache_scope): a state stored under one
    # scope is never found under another.
    def lookup(self, prompt_tokens: Sequence[int], scope: str = "", beyond: int = 0) -> tuple[int, bytes] | None:
        """The longest cached prefix of the prompt, longer than `beyond` tokens (the engine holds
        that many in a resident slot already): (n_tokens, state). The state may hold more
        tokens, of a prompt that parts from this one at n_tokens: the engine cuts it there.
        A hook with `bind_window(n_swa)` is told the model's sliding window (0: none) when the
        engine starts, and cuts no state past what that window keeps."""

    def boundaries_to_store(self, prompt_tokens: Sequence[int], scope: str = "") -> Sequence[int]:
        """Token counts (block boundaries <= len(prompt)-1) whose state is not stored yet."""

    def store(self, prompt_tokens: Sequence[int], n_tokens: int, state: bytes, scope: str = "") -> None:
        """Called right after the KV of prompt_tokens[:n_tokens] is complete; must return fast.

        For a request with `store_final_state`, also once at its end: `prompt_tokens` are
        then the prompt and the generated tokens whose KV is complete, and `n_tokens` the
        longest boundary of them that `boundaries_to_store` offered.
        """


class Forcing(Protocol):
    """A sequence's grammar as a draft source sees it (node/engine/grammar.py's Matcher)."""

    def forced(self) -> Sequence[int]:
        """Tokens the grammar admits no alternative to after the sequence's context; [] when free."""

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of these tokens, in order, the grammar admits after the sequence's context."""


PROMPT_SHARE = 0.5  # of a step's token budget, what a plan always leaves waiting prompts (`Speculator.plan`)


@dataclass(frozen=True, slots=True)
class DraftSeq:
    """What a draft source knows of one sequence: its identity, siblings, prompt, sampling and grammar."""

    key: int                   # unique for the engine's life
    group: int                 # shared by the sequences of one request (n > 1 siblings)
    prompt: tuple[int, ...]
    sampled: bool              # False: greedy
    sampling: SamplingParams | None = None
    grammar: Forcing | None = None  # the sequence's parse state, when its output is constrained
    seed: int | None = None    # the sequence's sampling seed (a draft model derives its own from it)
    voted: bool = False        # its group's vote may end it before its slowest member (a Conclave)


@dataclass(frozen=True, slots=True)
class Draft:
    """Tokens proposed to follow a sequence's context, and who proposed them.

    `dists` (one per token) is set by sources that draw their tokens from a distribution (a
    draft model drafting for a sampled sequence): the (token ids, probabilities) each token
    was drawn from, every id outside having probability 0. A sampled sequence then verifies
    the draft by rejection sampling against it (node/engine/verify.py). Deterministic
    sources (lookup, the Palimpsest, a greedy draft) leave it None.
    """

    tokens: tuple[int, ...]
    source: str
    dists: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None
    match: int = 0  # context tokens the source matched to propose it (0: the source does not say)
    echo: bool = False  # what it matched is the sequence's own output: the text repeats itself
    # The token the source expects after `tokens`: no row of its own, a hint for the row after
    # the last drafted token (a greedy choice keeps it at a near-tie, as it keeps a draft token).
    after: int | None = None
    replay: bool = False  # a past answer to the same prompt, agreeing with all the sequence wrote so far

    def head(self, n: int) -> Draft:
        """The first n tokens (and their distributions); the token after them becomes the hint."""
        if n >= len(self.tokens):
            return self
        return Draft(self.tokens[:n], self.source, self.dists[:n] if self.dists is not None else None, self.match,
                     self.echo, int(self.tokens[n]), self.replay)


@dataclass(frozen=True, slots=True)
class DraftAsk:
    """One decoding sequence's question to the planner: its context (prompt + output so far,
    ending with the token the step decodes), the most draft tokens it may carry, and the most
    tokens it may still generate (its max_tokens less what it sampled; 0: not said)."""

    seq: DraftSeq
    context: Sequence[int]
    room: int
    left: int = 0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The planner's answer: drafts by `DraftSeq.key` (a sequence without one decodes plainly)
    and the prompt tokens the step carries beside decoding (at most what was offered)."""

    drafts: dict[int, Draft]
    prefill: int
    # Sequences decoding without a draft this step, by key: the token a source expects next (a
    # hint for their one row, no row of its own; see `Draft.after`).
    hints: dict[int, int] = field(default_factory=dict)


@runtime_checkable
class Speculator(Protocol):
    """The engine's one draft hook; every method runs on the engine thread and must be fast."""

    def calibrate(self, measure: Callable[[int, int], float | None],
                  attend: Callable[[int, int], float | None]) -> None:
        """Called before the first step and when `calibration_due`: `measure(n_seqs, k)` is the seconds of a decode
        of n_seqs sequences with k draft tokens each (logits on every token), or None once a
        request is waiting: calibration must then stop and make do with what it has.
        `attend(context, k)`: the seconds of a decode of one sequence's k draft tokens after
        `context` tokens of it (logits on every token; the context computed unmeasured before),
        or None once a request waits or where a slot cannot hold that many."""

    def calibration_due(self) -> bool:
        """The step costs have moved away from the calibrated ones: the engine calls
        `calibrate` again the next time it is idle (no sequence active, none waiting)."""

    def begin(self, seq: DraftSeq) -> None:
        """A sequence starts decoding."""

    def plan(self, n_decoding: int, asks: Sequence[DraftAsk], prefill: int, budget: int,
             draining: int | None = None, refill: float = 0.0) -> StepPlan:
        """The step as a whole: n_decoding sequences decode one token each (`asks` are those
        that may carry drafts); `prefill` prompt tokens wait to go in beside them; `budget` is
        the most tokens the step may hold beyond the decoding tokens. Drafts (each at most
        its ask's room) and prefill together stay within the budget, and the prefill gets at
        least min(prefill, PROMPT_SHARE x budget) whatever the drafts. `draining` is None while
        requests wait to join the batch; once none does, the most tokens a decoding sequence
        without an ask may still generate (0: every one asks). `refill`: how often a slot freed
        while the batch went on was lately taken again at once (node/engine/refill.py), the
        chance that the batch's end is not the end of its work."""

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        """The target kept `accepted` of the draft's tokens (a prefix of them)."""

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float,
                  spans: Sequence[tuple[int, int]] = ()) -> None:
        """A decode-only step of n_tokens tokens (all with logits) took decode_s seconds;
        `spans`: each sequence's (context before its rows, rows) in it."""

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        """The sequence ended; `tokens` are its prompt and generated tokens."""
