"""The verify cost curve: what a decode step costs by the number of tokens in it.

On a CPU the cost of a decode step is dominated by reading the weights once (shared by every
token in the batch) and by the output projection, paid once per token with logits; which
sequence a token belongs to matters little (measured here: 4 users' single tokens cost
about what 4 tokens of one sequence cost). So the curve is one function of the step's
token count, measured at start-up by the engine (`calibrate`) for 1..MAX_TOKENS tokens and
interpolated linearly in between (extrapolated from the last two points above).

The host's speed changes (other processes on shared cores): every decode-only step's
measured time updates a scale factor (moving average of measured / predicted), so the
curve follows the host without re-measuring; the shape is what matters to the controller.
"""

from __future__ import annotations

import bisect
import logging
from typing import Callable

log = logging.getLogger(__name__)

PROBE_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 17, 24, 32, 48, 68)
REPEATS = 2
SCALE_EMA = 0.05


class CostCurve:
    def __init__(self, points: dict[int, float] | None = None) -> None:
        # a default shape until measured: 12.6 ms per step + 1.2 ms per token (this machine)
        self._points = dict(points or {1: 0.0126, 8: 0.0328, 64: 0.10})
        self._sizes = sorted(self._points)
        self.scale = 1.0
        self.measured = points is not None

    def calibrate(self, measure: Callable[[int, int], float], n_parallel: int, max_draft: int) -> None:
        """`measure(n_seqs, k)`: seconds of one decode of n_seqs sequences with k drafts each."""
        largest = n_parallel * (1 + max_draft)
        points: dict[int, float] = {}
        measure(1, 0)  # warm-up: first use of the buffers
        for size in PROBE_SIZES:
            if size > largest:
                break
            if size <= 1 + max_draft:
                n_seqs, k = 1, size - 1
            elif size % n_parallel == 0 and size // n_parallel - 1 <= max_draft:
                n_seqs, k = n_parallel, size // n_parallel - 1
            else:
                continue
            points[size] = min(measure(n_seqs, k) for _ in range(REPEATS))
        if len(points) >= 2:
            self._points, self._sizes, self.measured = points, sorted(points), True
            self.scale = 1.0
            log.info("verify cost curve: %s", ", ".join(f"{n} tok {s * 1000:.1f} ms" for n, s in sorted(points.items())))

    def seconds(self, n_tokens: int) -> float:
        sizes, points = self._sizes, self._points
        n = max(1, n_tokens)
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            base = points[n]
        else:
            lo, hi = (i - 1, i) if 0 < i < len(sizes) else ((len(sizes) - 2, len(sizes) - 1) if i else (0, 1))
            a, b = sizes[lo], sizes[hi]
            base = points[a] + (points[b] - points[a]) * (n - a) / (b - a)
        return max(base, 1e-6) * self.scale

    def observe(self, n_tokens: int, seconds: float) -> None:
        predicted = self.seconds(n_tokens) / self.scale
        if predicted > 0 and seconds > 0:
            ratio = min(4.0, max(0.25, seconds / predicted))
            self.scale += SCALE_EMA * (ratio - self.scale)

    def table(self) -> dict[int, float]:
        return {n: self.seconds(n) for n in self._sizes}
