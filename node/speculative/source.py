"""The seam between the controller and its draft sources.

A source keeps per-sequence state between `begin` and `end`, answers `propose` on the
engine thread without I/O or locks held by other threads for long. What was kept is the
controller's to judge (per source, per position), not the source's. Index sources answer in microseconds; a source whose drafts cost
real time to make (a draft model) says so in `cost_per_token` (seconds, measured), and the
controller then asks it only for as many tokens as it expects to pay. Sources never decide
whether drafting pays: the controller does, from what they proposed and what was kept.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from node.engine.hooks import Draft, DraftSeq


class DraftSource(Protocol):
    name: str
    # seconds of engine-thread time one drafted token costs to make; index sources: 0.0
    cost_per_token: float

    def begin(self, seq: DraftSeq) -> None: ...

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        """Up to k tokens likely to follow `context` (prompt + output so far), or None."""

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None: ...


def agreeing_run(stream: Sequence[int], end: int, context: Sequence[int], known: int, longest: int) -> int:
    """How many tokens before `end` in `stream` agree with the context's last ones, the first
    `known` of them already matched (an indexed n-gram), counted back as far as the two keep
    agreeing and at most `longest`: the match a source reports (`Draft.match`). A copy under way
    has a long run, a phrase met by chance a short one."""
    run, length = known, len(context)
    limit = min(longest, end, length)
    while run < limit and stream[end - 1 - run] == context[length - 1 - run]:
        run += 1
    return run

