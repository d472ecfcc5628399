"""The verify cost curve: what a decode step costs by the number of tokens in it.

On a CPU the cost of a decode step is dominated by reading the weights once (shared by every
token in the batch) and by the output projection, paid once per token with logits; which
sequence a token belongs to matters little (measured here: 4 users' single tokens cost
about what 4 tokens of one sequence cost). So the curve is one function of the step's
token count, measured at start-up by the engine (`calibrate`) for 1..MAX_TOKENS tokens and
fitted with a robust line (Theil-Sen: the median of pairwise slopes, so a step slowed by
another process on the same cores does not bend it).

The host's speed changes (other processes on shared cores): every decode-only step's
measured time updates a scale factor (moving average of measured / predicted), so the
curve follows the host without re-measuring; the shape is what matters to the controller.
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)

PROBE_SIZES = (1, 2, 3, 5, 9, 17, 32, 68)
REPEATS = 3
SCALE_EMA = 0.05


class CostCurve:
    """seconds(n) = (intercept + slope * n) * scale: a line fitted robustly to measured steps."""

    def __init__(self, points: dict[int, float] | None = None, *, fixed: bool = False) -> None:
        # the shape measured on this machine until calibrated: 12.6 ms a step + ~2.6 ms a token
        self.intercept, self.slope = 0.0104, 0.0026
        self.scale = 1.0
        self.measured = False
        self.points: dict[int, float] = {}
        if points:
            self.fit(points)
        self.fixed = fixed  # neither calibrated nor scaled (tests that must not depend on the host)

    def fit(self, points: dict[int, float]) -> None:
        """Theil-Sen: the median of pairwise slopes, so one step disturbed by another process
        does not bend the line."""
        sizes = sorted(points)
        slopes = sorted((points[b] - points[a]) / (b - a) for i, a in enumerate(sizes) for b in sizes[i + 1:])
        if not slopes:
            return
        slope = max(0.0, slopes[len(slopes) // 2])
        intercepts = sorted(points[n] - slope * n for n in sizes)
        intercept = intercepts[len(intercepts) // 2]
        self.intercept, self.slope = max(intercept, 1e-5), slope
        self.points, self.measured, self.scale = dict(points), True, 1.0

    def calibrate(self, measure: Callable[[int, int], float | None], n_parallel: int, max_draft: int) -> None:
        """`measure(n_seqs, k)`: seconds of one decode of n_seqs sequences with k drafts each, or
        None when requests are waiting: then what was measured so far is used (or the default
        line), and the online scale does the rest."""
        if self.fixed:
            return
        largest = n_parallel * (1 + max_draft)
        shapes: dict[int, tuple[int, int]] = {}
        for size in PROBE_SIZES:
            if size > largest:
                break
            if size <= 1 + max_draft:
                shapes[size] = (1, size - 1)
            elif size % n_parallel == 0 and size // n_parallel - 1 <= max_draft:
                shapes[size] = (n_parallel, size // n_parallel - 1)
        points: dict[int, float] = {}
        if measure(1, 0) is not None:  # warm-up: first use of the buffers
            for _ in range(REPEATS):  # rounds over every size: a burst of load touches all of them alike
                for size, (n_seqs, k) in shapes.items():
                    seconds = measure(n_seqs, k)
                    if seconds is None:
                        break
                    points[size] = min(points.get(size, seconds), seconds)
                else:
                    continue
                break
        if len(points) >= 2:
            self.fit(points)
            log.info("verify cost curve: %.1f ms + %.2f ms per token (measured: %s)", self.intercept * 1000,
                     self.slope * 1000, ", ".join(f"{n} tok {s * 1000:.1f} ms" for n, s in sorted(points.items())))

    def plain_rate(self) -> float | None:
        """Tokens per second of plain single-stream decoding as calibrated at start-up (one token
        per step, the scale left out), or None before a calibration."""
        if not self.measured:
            return None
        return 1.0 / (self.intercept + self.slope)

    def seconds(self, n_tokens: int) -> float:
        return (self.intercept + self.slope * max(1, n_tokens)) * self.scale

    def observe(self, n_tokens: int, seconds: float) -> None:
        if self.fixed:
            return
        predicted = self.seconds(n_tokens) / self.scale
        if predicted > 0 and seconds > 0:
            ratio = min(8.0, max(0.125, seconds / predicted))
            self.scale += SCALE_EMA * (ratio - self.scale)

    def table(self) -> dict[int, float]:
        return {n: self.seconds(n) for n in (1, 2, 4, 8, 16, 32, 64)}
