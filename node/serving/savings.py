"""What the node saved, over time: tokens served against tokens computed, by tier.

`Savings` samples cumulative counters every `[stats] sample_seconds`: the service's ledger
(node/serving/ledger.py: tokens served, the part replayed from L1, busy seconds), the
engine's counters (`prefill_tokens`, `generated_tokens`, `draft_accepted`,
`prefix_tokens_restored`, `resident_tokens`) and the speculation statistics' accepted draft tokens per source
(node/speculative/stats.py). Tokens computed are the ones the model ran a step for:
prompt tokens prefilled plus generated tokens that were not accepted drafts, plus tokens of
embedding inputs decoded (`embedding_tokens`). Each tier's
saving is the tokens served without that work: L1 (whole answers, prompt and completion,
replayed), prefix (prompt tokens restored from the prefix KV cache or continued from a
resident slot's KV), drafts (generated
tokens verified in another token's step).

Effective tokens per second are completion tokens served per busy second (L1 answers
included); the plain rate is single-stream decoding as the speculation controller's
calibration measured it at start-up (None with speculation off). `report()` gives since
start, the last `window_minutes`, and the trend (one point per sample); `run()` samples and,
every `log_minutes` in which something was served, logs one line.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from node.serving.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SavingsConfig:
    window_minutes: int = 15
    sample_seconds: int = 10
    log_minutes: int = 5


@dataclass(frozen=True, slots=True)
class Point:
    """Cumulative counters at one moment."""

    t: float
    busy_s: float
    answers: int
    l1_answers: int
    prompt: int
    completion: int
    computed: int
    l1: int
    prefix: int
    drafts: Mapping[str, int] = field(default_factory=dict)

    @property
    def served(self) -> int:
        return self.prompt + self.completion


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0


def _rate(tokens: float, seconds: float) -> float | None:
    return round(tokens / seconds, 2) if seconds > 0 else None


class Savings:
    def __init__(self, ledger: Ledger, engine_stats: Callable[[], Mapping[str, Any]], *,
                 drafts: Callable[[], Mapping[str, int]] | None = None,
                 plain_rate: Callable[[], float | None] | None = None,
                 config: SavingsConfig = SavingsConfig(), clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.engine_stats = engine_stats
        self.drafts = drafts
        self.plain_rate = plain_rate
        self.config = config
        self.clock = clock
        keep = config.window_minutes * 60 // config.sample_seconds + 2
        self.samples: collections.deque[Point] = collections.deque(maxlen=keep)
        self.start = self.point()
        self.samples.append(self.start)

    def point(self) -> Point:
        stats = self.engine_stats()
        counter: Callable[[str], int] = lambda key: int(stats.get(key, 0) or 0)  # noqa: E731
        computed = (counter("prefill_tokens") + counter("generated_tokens") - counter("draft_accepted")
                    + counter("embedding_tokens"))
        drafts = dict(self.drafts()) if self.drafts is not None else {}
        ledger = self.ledger
        return Point(self.clock(), ledger.busy_s, ledger.answers, ledger.l1_answers, ledger.prompt_tokens,
                     ledger.completion_tokens, computed,
                     ledger.l1_tokens, counter("prefix_tokens_restored") + counter("resident_tokens"), drafts)

    def sample(self) -> Point:
        point = self.point()
        self.samples.append(point)
        return point

    def period(self, a: Point, b: Point) -> dict[str, Any]:
        """What was served and saved from a to b."""
        served = b.served - a.served
        drafts = {name: b.drafts.get(name, 0) - a.drafts.get(name, 0) for name in b.drafts}
        drafted = sum(drafts.values())
        tiers = {"l1": b.l1 - a.l1, "prefix": b.prefix - a.prefix}
        busy = b.busy_s - a.busy_s
        effective = _rate(b.completion - a.completion, busy)
        plain = self.plain_rate() if self.plain_rate is not None else None
        return {
            "seconds": round(b.t - a.t, 3), "busy_seconds": round(busy, 3), "answers": b.answers - a.answers,
            "tokens_served": served, "prompt_tokens": b.prompt - a.prompt,
            "completion_tokens": b.completion - a.completion, "tokens_computed": b.computed - a.computed,
            "saved": {
                "l1": {"tokens": tiers["l1"], "share": _share(tiers["l1"], served),
                       "answers": b.l1_answers - a.l1_answers},
                "prefix": {"tokens": tiers["prefix"], "share": _share(tiers["prefix"], served)},
                "drafts": {"tokens": drafted, "share": _share(drafted, served), "by_source": drafts},
            },
            "effective_tokens_per_second": effective,
            "plain_tokens_per_second": round(plain, 2) if plain else None,
            "speedup": round(effective / plain, 3) if effective is not None and plain else None,
        }

    def report(self) -> dict[str, Any]:
        now = self.point()
        since = now.t - self.config.window_minutes * 60
        first = next((p for p in self.samples if p.t >= since), now)
        points = [*self.samples, now]
        trend = []
        for a, b in zip(points, points[1:]):
            if b.t - a.t <= 0 or b.t < since:
                continue
            seconds = b.t - a.t
            trend.append({"t": round(b.t, 3), "served_per_second": _rate(b.served - a.served, seconds),
                          "computed_per_second": _rate(b.computed - a.computed, seconds),
                          "effective_per_second": _rate(b.completion - a.completion, b.busy_s - a.busy_s)})
        return {"object": "reame.stats", "started_at": round(self.start.t, 3), "time": round(now.t, 3),
                "window_minutes": self.config.window_minutes, "sample_seconds": self.config.sample_seconds,
                "since_start": self.period(self.start, now), "window": self.period(first, now), "trend": trend}

    def line(self, a: Point, b: Point) -> str:
        """The log line of one period."""
        p = self.period(a, b)
        saved = p["saved"]
        speed = p["effective_tokens_per_second"]
        text = (f"served {p['tokens_served']} tokens, computed {p['tokens_computed']} "
                f"(L1 {saved['l1']['share']:.0%}, prefix {saved['prefix']['share']:.0%}, "
                f"drafts {saved['drafts']['share']:.0%}), effective "
                f"{speed if speed is not None else 0:.1f} tok/s")
        if p["speedup"] is not None:
            text += f" = {p['speedup']:.2f} x plain ({p['plain_tokens_per_second']:.1f} tok/s)"
        return text

    async def run(self) -> None:
        """Sample forever; log a line every log_minutes in which something was served."""
        logged = self.start
        while True:
            await asyncio.sleep(self.config.sample_seconds)
            point = self.sample()
            minutes = self.config.log_minutes
            if minutes and point.t - logged.t >= minutes * 60:
                if point.served > logged.served:
                    log.info("%s", self.line(logged, point))
                logged = point
