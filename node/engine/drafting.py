"""The scheduler's side of speculation: which sequences may ask for drafts, what the step's
plan gives each, and the notices a `Speculator` (node/engine/hooks.py) hears.

`Drafting` owns the speculator. Without one (none configured, or `max_draft` 0) it holds a
`NoSpeculator`, whose methods do nothing and whose plan proposes no drafts, and `enabled` is
False: no sequence begins drafting, so none asks. Every call into the speculator is
guarded: an exception is logged and counts as "nothing to offer" (hooks.py), never ends a
request. Nothing here touches the llama context or the scheduler's state: `plan` returns a
`DraftPlan` the scheduler applies, `begin` the `DraftSeq` it keeps on the sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

from node.engine.hooks import Draft, DraftAsk, DraftSeq, Speculator, StepPlan
from node.engine.sequence import Sequence

log = logging.getLogger(__name__)


class NoSpeculator:
    """The speculator of an engine without one: it never drafts and never asks to calibrate."""

    def calibrate(self, measure: Callable[[int, int], float | None],
                  attend: Callable[[int, int], float | None]) -> None:
        pass

    def calibration_due(self) -> bool:
        return False

    def begin(self, seq: DraftSeq) -> None:
        pass

    def plan(self, n_decoding: int, asks: Seq[DraftAsk], prefill: int, budget: int,
             draining: int | None = None, refill: float = 0.0) -> StepPlan:
        return StepPlan({}, prefill)

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        pass

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float,
                  spans: Seq[tuple[int, int]] = ()) -> None:
        pass

    def end(self, seq: DraftSeq, tokens: Seq[int]) -> None:
        pass


@dataclass(frozen=True, slots=True)
class DraftPlan:
    """The step's drafts by sequence key (each cut to its ask's room), the prompt tokens the
    step carries beside decoding, the draft rows (tokens) it adds, and the hints of sequences
    decoding without a draft."""

    drafts: dict[int, Draft]
    prefill: int
    rows: int = 0
    hints: dict[int, int] = field(default_factory=dict)  # the next token a source expects, for undrafted rows


class Drafting:
    def __init__(self, speculator: Speculator | None, max_draft: int) -> None:
        self.enabled = speculator is not None and max_draft > 0
        self.speculator: Speculator = speculator if speculator is not None and self.enabled else NoSpeculator()
        self._max_draft = max_draft

    def begin(self, seq: Sequence) -> DraftSeq | None:
        """A sequence starts decoding: what the speculator knows of it (None: it drafts not)."""
        if not self.enabled or not seq.request.speculation:
            return None
        draft_seq = DraftSeq(seq.key, seq.group, seq.prompt, not seq.request.sampling.greedy, seq.request.sampling,
                             grammar=seq.constraint, seed=seq.sampler.seed if seq.sampler is not None else seq.seed,
                             voted=seq.request.voted)
        self._guard("begin", lambda: self.speculator.begin(draft_seq))
        return draft_seq

    def ask(self, seq: Sequence) -> DraftAsk | None:
        """What a decoding sequence may ask the planner for: its room for drafts this step."""
        if seq.draft_seq is None:
            return None
        room = min(self._max_draft, seq.tokens_left - 1)
        return DraftAsk(seq.draft_seq, seq.tokens, room, seq.tokens_left) if room > 0 else None

    def plan(self, n_decoding: int, asks: list[DraftAsk], offered: int, room: int,
             draining: int | None = None, refill: float = 0.0) -> DraftPlan:
        """The speculator's plan for the step (all the prompt tokens offered when nothing drafts);
        `draining` and `refill` as `Speculator.plan` has them."""
        if not self.enabled or not n_decoding:
            return DraftPlan({}, offered)
        try:
            plan = self.speculator.plan(n_decoding, asks, offered, room, draining, refill)
        except Exception:
            log.exception("speculator plan() failed; decoding without drafts")
            return DraftPlan({}, offered)
        rooms = {ask.seq.key: ask.room for ask in asks}
        drafts: dict[int, Draft] = {}
        for key, draft in plan.drafts.items():
            if key in rooms and draft.tokens:
                drafts[key] = draft.head(rooms[key])
        rows = sum(len(d.tokens) for d in drafts.values())
        hints = {key: int(token) for key, token in plan.hints.items() if key in rooms and key not in drafts}
        return DraftPlan(drafts, max(0, min(plan.prefill, offered, room - rows)), rows, hints)

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        self._guard("verified", lambda: self.speculator.verified(seq, draft, accepted))

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float,
                  spans: Seq[tuple[int, int]] = ()) -> None:
        if self.enabled:
            self._guard("step_done", lambda: self.speculator.step_done(n_decoding, n_tokens, decode_s, spans))

    def end(self, seq: DraftSeq, tokens: Seq[int]) -> None:
        self._guard("end", lambda: self.speculator.end(seq, tokens))

    def calibrate(self, measure: Callable[[int, int], float | None],
                  attend: Callable[[int, int], float | None]) -> None:
        self._guard("calibrate", lambda: self.speculator.calibrate(measure, attend))

    def calibration_due(self) -> bool:
        if not self.enabled:
            return False
        try:
            return bool(self.speculator.calibration_due())
        except Exception:
            log.exception("speculator calibration_due() failed")
            return False

    @staticmethod
    def _guard(name: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            log.exception("speculator %s() failed", name)
