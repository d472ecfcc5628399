"""Sibling drafts: a sequence behind a sibling with the same tokens so far drafts its continuation.

The sequences of one group (a Conclave's candidates, a request's n > 1 choices) are forks
of one prompt. A candidate whose output so far equals the start of a sibling's (one started
later, one that kept fewer of its drafts, one that finished) is likely to go on as that
sibling did: the sibling's next tokens are its draft, and the match is the whole output they
share (`Draft.match`), so the controller learns how often agreement that long holds on.

Identical siblings at the same length need no draft from each other: they share one row of
logits (node/engine/riders.py). The draft is deterministic, so verification keeps it only
where the sequence's own draws agree (node/engine/verify.py): a sampled candidate's tokens
are exactly those it would draw without it.

A group whose members have all ended is kept (the last RETAINED_GROUPS of them) for
candidates that join it later (a Conclave that starts its rest once the first disagree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from node.engine.hooks import Draft, DraftSeq
from node.speculative.groups import GroupStates

RETAINED_GROUPS = 4


@dataclass(slots=True)
class _Group:
    prompt: int = 0
    streams: dict[int, Sequence[int]] = field(default_factory=dict)  # sequence key -> its context (live)


class SiblingDraft:
    """The `sibling` draft source."""

    name = "sibling"
    cost_per_token = 0.0
    prior = 0.7  # a sibling agreeing so far is a strong predictor; the controller learns the real rate

    def __init__(self) -> None:
        self._table: GroupStates[_Group] = GroupStates(lambda seq: _Group(len(seq.prompt)), RETAINED_GROUPS)

    def begin(self, seq: DraftSeq) -> None:
        self._table.begin(seq)

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        group = self._table.live.get(seq.group)
        if group is None:
            return None
        group.streams[seq.key] = context  # the engine's live list: siblings see it grow
        n, start = len(context), group.prompt
        if n <= start or k <= 0:
            return None
        mine = list(context[start:n])
        best: Sequence[int] | None = None
        for key, other in group.streams.items():
            if key == seq.key or len(other) <= n or (best is not None and len(other) <= len(best)):
                continue
            if other[n - 1] == context[n - 1] and list(other[start:n]) == mine:
                best = other
        if best is None:
            return None
        return Draft(tuple(best[n:n + k]), self.name, match=n - start)

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        group = self._table.live.get(seq.group)
        if group is not None:
            group.streams[seq.key] = tuple(tokens)
        self._table.end(seq)

    def siblings(self, group: int) -> int:
        """Streams the group holds (its live and ended members'), for tests and /health."""
        entry = self._table.live.get(group) or self._table.ended.get(group)
        return len(entry.streams) if entry is not None else 0
