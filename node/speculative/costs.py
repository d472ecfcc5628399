"""The verify cost curve: what a decode step costs by the number of tokens in it.

On a CPU the cost of a decode step is dominated by reading the weights once (shared by every
token in the batch) and by the output projection, paid once per token with logits; which
sequence a token belongs to matters little (measured here: 4 users' single tokens cost
about what 4 tokens of one sequence cost). So the curve is one function of the step's
token count, measured at start-up by the engine (`calibrate`) for 1..MAX_TOKENS tokens and
fitted with a robust line (Theil-Sen: the median of pairwise slopes, so a step slowed by
another process on the same cores does not bend it).

The host's speed changes (other processes on shared cores), and not only its speed: with a
core taken by another process, every extra token of a step can cost several times what it
did on a quiet host. So the curve follows the host three ways:
  - every decode-only step's measured time updates a scale factor (moving average of
    measured / predicted): the level, at once;
  - the recent steps by size (the last RECENT of each) refit the line every REFIT_EVERY
    steps once at least two sizes have MIN_RECENT steps each (plain steps of 1 and 4 users,
    verify steps of every draft length): the shape, from what the engine actually ran;
  - when the scale has stayed outside [1/DRIFT, DRIFT] for DRIFT_STEPS steps, `drifted` asks
    for a fresh calibration, which the engine runs the next time it is idle.
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from typing import Callable

log = logging.getLogger(__name__)

PROBE_SIZES = (1, 2, 3, 5, 9, 17, 32, 68)
REPEATS = 3
SCALE_EMA = 0.05
RECENT = 16          # recent steps kept per size for the online refit
MIN_RECENT = 4       # steps of a size before it counts in a refit
REFIT_EVERY = 64     # decode-only steps between refits
DRIFT = 1.5          # scale this far from 1 means the host changed speed
DRIFT_STEPS = 32     # for this many steps in a row
RECALIBRATE_MIN_S = 30.0  # at most one drift recalibration this often


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
        self._recent: dict[int, collections.deque[float]] = {}
        self._since_refit = 0
        self._drift_steps = 0
        self._calibrated_at = float("-inf")
        self.refits = 0
        self.calibrations = 0
        self._start_rate: float | None = None

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
        self._drift_steps = 0

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
        self._calibrated_at = time.monotonic()
        if len(points) >= 2:
            self.fit(points)
            if self._start_rate is None:
                self._start_rate = 1.0 / (self.intercept + self.slope)
            self.calibrations += 1
            self._recent.clear()
            log.info("verify cost curve: %.1f ms + %.2f ms per token (measured: %s)", self.intercept * 1000,
                     self.slope * 1000, ", ".join(f"{n} tok {s * 1000:.1f} ms" for n, s in sorted(points.items())))

    def plain_rate(self) -> float | None:
        """Tokens per second of plain single-stream decoding (one token a step) as the first
        calibration measured it, or None before one; refits and recalibrations leave it."""
        return self._start_rate

    def seconds(self, n_tokens: int) -> float:
        return (self.intercept + self.slope * max(1, n_tokens)) * self.scale

    def observe(self, n_tokens: int, seconds: float) -> None:
        if self.fixed or seconds <= 0:
            return
        predicted = self.seconds(n_tokens) / self.scale
        if predicted > 0:
            ratio = min(8.0, max(0.125, seconds / predicted))
            self.scale += SCALE_EMA * (ratio - self.scale)
        recent = self._recent.get(n_tokens)
        if recent is None:
            recent = self._recent[n_tokens] = collections.deque(maxlen=RECENT)
        recent.append(seconds)
        self._drift_steps = self._drift_steps + 1 if not 1 / DRIFT <= self.scale <= DRIFT else 0
        self._since_refit += 1
        if self._since_refit >= REFIT_EVERY:
            self._since_refit = 0
            self._refit()

    def _refit(self) -> None:
        """The line through the recent steps' medians by size, when two sizes have enough."""
        points = {n: statistics.median(d) for n, d in self._recent.items() if len(d) >= MIN_RECENT}
        if len(points) < 2:
            return
        before = (self.intercept * self.scale, self.slope * self.scale)
        self.fit(points)
        self.refits += 1
        if abs(self.slope - before[1]) > 0.25 * max(before[1], 1e-4):
            log.info("verify cost curve refitted from recent steps: %.1f ms + %.2f ms per token (was %.1f + %.2f)",
                     self.intercept * 1000, self.slope * 1000, before[0] * 1000, before[1] * 1000)

    @property
    def drifted(self) -> bool:
        """The host's speed has moved away from the calibrated line for a while: re-measure."""
        return (not self.fixed and self._drift_steps >= DRIFT_STEPS
                and time.monotonic() - self._calibrated_at >= RECALIBRATE_MIN_S)

    def table(self) -> dict[int, float]:
        return {n: self.seconds(n) for n in (1, 2, 4, 8, 16, 32, 64)}
