"""Per-source speculation statistics: one place the controller writes and /metrics and /health read.

Written on the engine thread only; readers on other threads take `snapshot()`, a copy of
plain numbers (a counter read mid-step may be one step old, never torn).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SourceStats:
    name: str
    max_draft: int
    proposals: int = 0           # drafts verified
    drafted: int = 0             # draft tokens verified
    accepted: int = 0            # draft tokens kept
    verify_s: float = 0.0        # the share of decode time spent on this source's draft rows
    make_s: float = 0.0          # time spent making the drafts (a draft model's decodes; index sources: 0)
    saved_s: float = 0.0         # estimated time saved: plain decoding's time for the kept tokens - verify_s - make_s
    switched_off: int = 0
    switched_on: int = 0
    on: bool = True
    reached: list[int] = field(default_factory=list)    # by position: drafts that reached it
    kept: list[int] = field(default_factory=list)       # by position: drafts whose token there was kept
    lengths: list[int] = field(default_factory=list)    # accepted-length histogram, 0..max_draft

    def __post_init__(self) -> None:
        self.reached = [0] * self.max_draft
        self.kept = [0] * self.max_draft
        self.lengths = [0] * (self.max_draft + 1)

    def record(self, drafted: int, accepted: int) -> None:
        self.proposals += 1
        self.drafted += drafted
        self.accepted += accepted
        for i in range(min(drafted, accepted + 1, self.max_draft)):
            self.reached[i] += 1
        for i in range(min(accepted, self.max_draft)):
            self.kept[i] += 1
        self.lengths[min(accepted, self.max_draft)] += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "proposals": self.proposals, "drafted": self.drafted, "accepted": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "verify_seconds": round(self.verify_s, 6), "making_seconds": round(self.make_s, 6),
            "saved_seconds": round(self.saved_s, 6),
            "on": self.on, "switched_off": self.switched_off, "switched_on": self.switched_on,
            "acceptance_by_position": [round(k / r, 3) if r else None for k, r in zip(self.kept, self.reached)],
            "accepted_lengths": list(self.lengths),
        }


class SpeculationStats:
    def __init__(self, sources: list[str], max_draft: int) -> None:
        self.sources = {name: SourceStats(name, max_draft) for name in sources}
        self.max_draft = max_draft
        self.steps_with_drafts = 0
        self.steps_rested = 0  # steps the planner did not plan: a rest after plans that verified nothing

    def __getitem__(self, name: str) -> SourceStats:
        return self.sources[name]

    def snapshot(self) -> dict[str, dict[str, object]]:
        return {name: stats.snapshot() for name, stats in list(self.sources.items())}
