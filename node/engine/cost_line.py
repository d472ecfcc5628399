"""The step cost line: seconds of one decode step as `per_step + per_token * tokens with logits`.

On a CPU a decode step reads every weight once (shared by all the tokens in it) and runs the
output projection once per token that needs logits, so a step's time is close to a line in
its token count. The line is what every speculation decision and every speed figure rests on,
so it is fitted from noisy timings with three defences:

  - repeats: each size's samples are reduced to their median, so a one-off spike (the first
    multi-row step paying for its buffers, a page fault, another process's burst) counts as
    one vote among several, not as the value;
  - a robust slope: the median of the pairwise slopes between sizes (Theil-Sen);
  - physical bounds: a token with logits can cost neither less than nothing nor more than the
    cheapest whole step measured, and the fixed part of a step can be neither negative nor more
    than that cheapest step less one token's share. A fit outside them is clamped to them, and
    the line says so (`clamped`).

Kept in the engine (it owns the timings: the kernel probe's child, the scheduler's idle
measurements); the speculation controller's cost curve (node/speculative/costs.py) fits
with the same function.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

MIN_SIZES = 2  # a line needs two distinct sizes


@dataclass(frozen=True, slots=True)
class CostLine:
    per_step: float   # seconds a step costs whatever it holds
    per_token: float  # seconds each token with logits adds
    clamped: bool = False  # the raw fit broke a physical bound and was brought back to it

    def seconds(self, n_tokens: int) -> float:
        return self.per_step + self.per_token * max(1, n_tokens)

    @property
    def row_share(self) -> float:
        """What an extra token with logits costs as a share of a one-token step."""
        one = self.seconds(1)
        return self.per_token / one if one > 0 else 0.0

    def describe(self) -> str:
        return (f"{self.per_step * 1000:.1f} ms + {self.per_token * 1000:.2f} ms per token with logits "
                f"(a row is {self.row_share:.2f} of a one-token step)")

    def as_dict(self) -> dict[str, float]:
        return {"per_step": round(self.per_step * 1000, 2), "per_token": round(self.per_token * 1000, 2),
                "row_share": round(self.row_share, 3)}


def medians(samples: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Each size's median over its positive samples (sizes without one are left out)."""
    out: dict[int, float] = {}
    for size, values in samples.items():
        good = [v for v in values if v > 0]
        if size >= 1 and good:
            out[int(size)] = statistics.median(good)
    return out


def fit_line(points: Mapping[int, float]) -> CostLine | None:
    """The robust line through (tokens, seconds) points, within the physical bounds; None with
    fewer than two sizes."""
    sizes = sorted(n for n, s in points.items() if n >= 1 and s > 0)
    if len(sizes) < MIN_SIZES:
        return None
    slopes = [(points[b] - points[a]) / (b - a) for i, a in enumerate(sizes) for b in sizes[i + 1:]]
    slope = statistics.median(slopes)
    cheapest = min(points[n] for n in sizes)
    clamped = False
    if not 0.0 <= slope <= cheapest:
        slope, clamped = min(max(slope, 0.0), cheapest), True
    intercept = statistics.median([points[n] - slope * n for n in sizes])
    ceiling = cheapest - slope  # the line's one-token step cannot cost more than any step measured
    if not 0.0 <= intercept <= ceiling:
        intercept, clamped = min(max(intercept, 0.0), ceiling), True
    return CostLine(intercept, slope, clamped)


def fit_samples(samples: Mapping[int, Sequence[float]]) -> CostLine | None:
    """`fit_line` over each size's median: the line from repeated, possibly polluted timings."""
    return fit_line(medians(samples))
