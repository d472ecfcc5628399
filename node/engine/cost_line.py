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
    # The staircase (`fit_steps`): a step of more than `tile` tokens with logits whose count is
    # not a multiple of `tile` costs `tail` seconds more (tile 1: a plain line).
    tile: int = 1
    tail: float = 0.0
    # A step of one token with logits costs `solo` seconds less than the line through the
    # larger steps (`fit_steps`): a lone row runs matrix-vector kernels, which on some hosts
    # cost less for it than the matrix-matrix kernels of several rows cost per row.
    solo: float = 0.0

    def seconds(self, n_tokens: int) -> float:
        n = max(1, n_tokens)
        return (self.per_step + self.per_token * n + (self.tail if self.off_tile(n) else 0.0)
                - (self.solo if n == 1 else 0.0))

    def scaled(self, factor: float) -> CostLine:
        """The same shape on a host `factor` times as slow."""
        return CostLine(self.per_step * factor, self.per_token * factor, self.clamped, self.tile,
                        self.tail * factor, self.solo * factor)

    def off_tile(self, n_tokens: int) -> bool:
        """Whether a step of this many tokens with logits pays the staircase's tail."""
        return off_tile(self.tile, n_tokens)

    @property
    def row_share(self) -> float:
        """What an extra token with logits costs as a share of a one-token step."""
        one = self.seconds(1)
        return self.per_token / one if one > 0 else 0.0

    def describe(self) -> str:
        stairs = (f"; past {self.tile} rows, a count that is not a multiple of {self.tile} costs "
                  f"{self.tail * 1000:.1f} ms more" if self.tile > 1 else "")
        if self.solo > 0:
            stairs += f"; a one-token step costs {self.solo * 1000:.1f} ms less than the line"
        return (f"{self.per_step * 1000:.1f} ms + {self.per_token * 1000:.2f} ms per token with logits "
                f"(a row is {self.row_share:.2f} of a one-token step{stairs})")

    def as_dict(self) -> dict[str, float]:
        out = {"per_step": round(self.per_step * 1000, 2), "per_token": round(self.per_token * 1000, 2),
               "row_share": round(self.row_share, 3)}
        if self.tile > 1:
            out.update(tile=self.tile, tail=round(self.tail * 1000, 2))
        if self.solo > 0:
            out.update(solo=round(self.solo * 1000, 2))
        return out


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


def fit_steps(points: Mapping[int, float]) -> CostLine | None:
    """The line, or a staircase on a line, or a line that a lone row undercuts, where the
    points show one (`CostLine.tile`, `CostLine.solo`).

    The output projection's kernels work on tiles of rows: with llama.cpp's stock kernels on the
    AVX-512 hosts measured here a step of 5, 6 or 7 tokens with logits costs about what 8 cost,
    and one of 9 more than one of 12, while up to 4 the cost is a line; on another (an AVX2-only
    EPYC) every odd count past 2 costs what the next even one does (the patched build,
    deploy/llama_cpp, removes the first, and the odd counts' second pass of an AVX2 build measured
    on the Xeon); and a lone row, decoded by matrix-vector kernels, costs
    a third less than the line through 2, 4, 8 and 16 rows says. So for each candidate tile
    (TILES, or none) and with or without the lone row apart, the line is fitted through the
    sizes left smooth (up to the tile, and its multiples; the lone row left out when apart),
    the tail is the median excess of the other sizes over that line, and `solo` what the lone
    row costs under it (at least SOLO_MIN of its step less). Such a shape is believed only
    where it fits the points at least STAIR_GAIN times better than the plain line (mean
    relative error), with at least two sizes on each side of a tile; otherwise the plain line
    stands."""
    line = fit_line(points)
    if line is None:
        return None
    best, best_error = line, _error(line, points)
    plain_error = best_error
    for tile in (1, *TILES):
        for apart in (False, True):
            if tile == 1 and not apart:
                continue  # the plain line
            if apart and 1 not in points:
                continue
            rest = {n: s for n, s in points.items() if not (apart and n == 1)}
            smooth = {n: s for n, s in rest.items() if not off_tile(tile, n)}
            rough = {n: s for n, s in rest.items() if off_tile(tile, n)}
            if tile > 1 and len(rough) < MIN_SIZES:
                continue
            base = fit_line(smooth)
            if base is None:
                continue
            tail = statistics.median(s - base.seconds(n) for n, s in rough.items()) if tile > 1 else 0.0
            if tile > 1 and tail <= 0:
                continue
            solo = base.seconds(1) - points[1] if apart else 0.0
            if apart and solo < SOLO_MIN * points[1]:
                continue
            candidate = CostLine(base.per_step, base.per_token, base.clamped, tile, tail, solo)
            error = _error(candidate, points)
            if error < best_error and error * STAIR_GAIN <= plain_error:
                best, best_error = candidate, error
    return best


TILES = (2, 4, 8, 16)
STAIR_GAIN = 2.0  # a staircase must fit the points this many times better than the line
SOLO_MIN = 0.15   # a lone row apart must cost at least this share of its step less than the line (not noise)


def _error(line: CostLine, points: Mapping[int, float]) -> float:
    """Mean relative error of the line at the points."""
    good = [(n, s) for n, s in points.items() if n >= 1 and s > 0]
    return sum(abs(line.seconds(n) - s) / s for n, s in good) / max(1, len(good))


def off_tile(tile: int, n_tokens: int) -> bool:
    """Whether a step of n_tokens with logits sits past a tile of `tile` rows and off its multiples."""
    return tile > 1 and n_tokens > tile and n_tokens % tile != 0
