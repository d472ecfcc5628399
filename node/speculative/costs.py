"""The verify cost curve: what a decode step costs by the number of tokens in it.

On a CPU the cost of a decode step is dominated by reading the weights once (shared by every
token in the batch) and by the output projection, paid once per token with logits; which
sequence a token belongs to matters little (measured here: 4 users' single tokens cost
about what 4 tokens of one sequence cost). So the curve is one function of the step's
token count: a line (node/engine/cost_line.py: medians of repeats, a Theil-Sen slope, the
physical bounds that a token with logits costs neither less than nothing nor more than a
one-token step), or a staircase on it where the measured sizes show one (`fit_steps`: the
output projection's kernels work in tiles of rows; on an AMX-trapping Xeon with llama.cpp's
stock kernels a step of 5 rows with logits cost what 8 cost, 14 ms more than 4, so the sizes
calibrated include both sides of each tile up to 17; the patched build, deploy/llama_cpp,
takes those rows in the same pass and the line stays a line there, except where AVX-512 VNNI
puts two token columns in a register: an odd count pays for a half-empty pair).

A row's attention reads its sequence's context, so the same row costs more late in a long
answer than at the calibration's empty cache (Gemma 3 270M on a 2-vCPU AMD EPYC of family 26,
17 rows of one sequence: 28.9 ms after no context, 35.3 ms after 128 tokens, 41.8 ms after 512,
42.9 ms after 1,024, where the sliding-window layers stop reading more). Priced at the empty
cache's slope, the drafts of four users' prose cost 20% more than planned: steps with 4 draft
rows beside 4 sequences ~150 tokens in took 1.08x their predicted time while their steps without
drafts took 0.95x. So the calibration also measures a step of CONTEXT_ROWS rows of one sequence
after each of CONTEXT_POINTS tokens of context, each beside the same rows without one
(`attend`), and `context_seconds(n)` is what a row costs more after n tokens than after none,
interpolated between them (past the last point, along the last stretch). The planner adds it
to the rows of each sequence by its context; the engine's steps are observed with it taken
out, so the line stays the empty cache's.

Beside the sizes, the calibration measures steps of k sequences with one token each, k up to
the slots (`spread`): what a step costs less when one of its sequences has finished
(`shed_seconds`), the worth of a token kept by a sequence that ends before the batch does
(node/speculative/draining.py). It is not the line's slope where the kernels work in tiles of
rows: on an AMD EPYC with repacked weights 3 sequences' step cost what 4 did (the slope said
4.2 ms less), 2 sequences' 10 ms more than one.

It is measured by the engine (`calibrate`) only while no request waits, never inside a
request's latency: every step shape is decoded once unmeasured first (the first multi-row
step pays one-off costs: buffers, repacked weights), then REPEATS rounds over the sizes of
PROBE_SIZES that fit, each size reduced to its median. The whole calibration stays within
CALIBRATION_BUDGET_S, but for MIN_ROUNDS rounds (on a slow host a round of every size takes
4 s, and a median of one sample is whatever burst of load it met); with fewer than
MIN_CALIBRATED_SIZES sizes measured the line is kept as it was (the default shape until the
first good calibration).

The host's speed changes (other processes on shared cores), and not only its speed: with a
core taken by another process, every extra token of a step can cost several times what it
did on a quiet host. So the curve follows the host three ways:
  - every decode-only step's measured time updates a scale factor (moving average of
    measured / predicted, each ratio bounded): the level, at once;
  - the recent steps by size (the last RECENT of each) give a candidate line every
    REFIT_EVERY steps once at least two sizes have MIN_RECENT steps each; a candidate is
    adopted only when the one before it agreed with it (within AGREE): a burst of load
    that fills one window moves nothing, a lasting change moves the shape one window later;
  - when the scale has stayed outside [1/DRIFT, DRIFT] for DRIFT_STEPS steps, `drifted` asks
    for a fresh calibration, which the engine runs the next time it is idle; successive
    drift calibrations back off (RECALIBRATE_MIN_S, doubling up to RECALIBRATE_MAX_S), so an
    idle node on a busy host does not spend its cores measuring. A curve never measured (the
    first calibration gave way to requests) is measured the same way (`due`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import statistics
import time
from typing import Callable

from node.engine.cost_line import CostLine, fit_steps, off_tile

log = logging.getLogger(__name__)

PROBE_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32, 68)
REPEATS = 5
MIN_CALIBRATED_SIZES = 3  # a line through fewer measured sizes is one outlier away from absurd
CALIBRATION_BUDGET_S = 6.0  # wall time one calibration may take (it stops at the end of a round): ~5 rounds quiet
MIN_ROUNDS = 3              # rounds measured whatever they take, unless a request waits
SCALE_EMA = 0.05
RECENT = 16          # recent steps kept per size for the online refit
MIN_RECENT = 4       # steps of a size before it counts in a refit
REFIT_EVERY = 64     # decode-only steps between refits
AGREE = 0.25         # two windows' slopes within this share of each other: the change is lasting
DRIFT = 1.5          # scale this far from 1 means the host changed speed
DRIFT_STEPS = 32     # for this many steps in a row
RECALIBRATE_MIN_S = 30.0   # the first drift recalibration at most this soon after the last one,
RECALIBRATE_MAX_S = 1800.0  # each further one twice as late, up to this
BEND_LIMITS = (0.85, 1.2)  # a calibrated size's bend is held within these (a median that met a burst)
BEND_NOISE = 0.03          # a size within this share of the shape is on it
CONTEXT_POINTS = (128, 512, 1024)  # contexts a row's extra cost is measured after (`attend`)
CONTEXT_ROWS = 17          # rows of the one sequence measured there (fewer where drafts are shorter)
CONTEXT_BUDGET_S = 4.0     # no further context is measured once this much time went to them (2.1 s on 2 EPYC cores)


class CostCurve:
    """seconds(n) = (intercept + slope * n + the staircase's tail where n is off its tile) * bend(n)
    * scale: a line or a staircase fitted robustly to measured steps, bent to the sizes measured."""

    def __init__(self, points: dict[int, float] | None = None, *, fixed: bool = False) -> None:
        # the shape of a one-token step of ~13 ms on a quiet 2-core host until calibrated:
        # 10.4 ms fixed + 2.6 ms per token with logits, no staircase, no lone-row discount
        self.shape = CostLine(0.0104, 0.0026)
        self.scale = 1.0
        self.measured = False
        self.points: dict[int, float] = {}
        self.bends: dict[int, float] = {}  # calibrated size -> measured / shape
        self.spread: dict[int, float] = {}  # k sequences of one token each -> a step's measured seconds
        self.context: dict[int, float] = {}  # context tokens -> what a row costs more there than after none
        self._bent_at: dict[int, float] = {}   # each size's shape seconds times its bend, unscaled
        self._bent_of: dict[int, float] | None = None  # the bends `_bent_at` was worked out from
        self._shape_of: CostLine | None = None  # and the shape
        if points:
            self.fit(points)
        self.fixed = fixed  # neither calibrated nor scaled (tests that must not depend on the host)
        self._recent: dict[int, collections.deque[float]] = {}
        self._since_refit = 0
        self._candidate: CostLine | None = None
        self._drift_steps = 0
        self._calibrated_at = float("-inf")
        self._recalibrate_after = RECALIBRATE_MIN_S
        self.refits = 0
        self.calibrations = 0
        self._start_rate: float | None = None

    @property
    def intercept(self) -> float:
        return self.shape.per_step

    @property
    def slope(self) -> float:
        return self.shape.per_token

    @property
    def tile(self) -> int:
        return self.shape.tile

    @property
    def tail(self) -> float:
        return self.shape.tail

    def restore(self, points: dict[int, float], spread: dict[int, float] | None = None,
                context: dict[int, float] | None = None) -> None:
        """Take a curve calibrated at an earlier start (cost_store.py) as this run's first."""
        self.fit(points)
        self.spread = dict(spread or {})
        self.context = _rising(context or {})
        if self._start_rate is None and self.measured:
            self._start_rate = 1.0 / (self.intercept + self.slope)

    def fit(self, points: dict[int, float]) -> None:
        """The line or staircase through these points (node/engine/cost_line.py: robust,
        physically bounded)."""
        self._adopt(fit_steps(points), points)

    def _adopt(self, line: CostLine | None, points: dict[int, float], bends: dict[int, float] | None = None) -> None:
        """Take the shape `line`; the bends are `bends` if given, else what `points` measured against it."""
        if line is None:
            return
        self.shape = dataclasses.replace(line, per_step=max(line.per_step, 1e-5), clamped=False)
        self.bends = dict(bends) if bends is not None else _bends(self.shape, points)
        self.points, self.measured, self.scale = dict(points), True, 1.0
        self._drift_steps = 0
        if line.clamped:
            log.info("verify cost curve: the fit broke a physical bound and was clamped to %s", line.describe())

    def calibrate(self, measure: Callable[[int, int], float | None], n_parallel: int, max_draft: int, *,
                  budget_s: float = CALIBRATION_BUDGET_S,
                  attend: Callable[[int, int], float | None] | None = None) -> None:
        """`measure(n_seqs, k)`: seconds of one decode of n_seqs sequences with k drafts each, or
        None when requests are waiting: then the calibration stops, and what was measured is
        used only if it covers MIN_CALIBRATED_SIZES sizes. `attend(context, k)`: seconds of one
        decode of one sequence's k drafts after `context` tokens of it (0: of a sequence of its
        own, the context kept where another slot holds it), or None when requests wait or a
        slot cannot hold that many (`_calibrate_context`)."""
        if self.fixed:
            return
        started = time.monotonic()
        retrying = (self.calibrations > 0 and self._drift_steps >= DRIFT_STEPS) or not self.measured
        shapes, spread = _shapes(n_parallel, max_draft), _spread(n_parallel)
        runs = _runs(shapes, spread)
        samples: dict[tuple[int, int], list[float]] = {}
        if all(measure(n_seqs, k) is not None for n_seqs, k in runs):  # warm-up, unmeasured
            for done in range(1, REPEATS + 1):  # rounds over every shape: a burst of load touches all of them alike
                for shape in runs:
                    seconds = measure(*shape)
                    if seconds is None:
                        break
                    samples.setdefault(shape, []).append(seconds)
                else:
                    if done < MIN_ROUNDS or time.monotonic() - started < budget_s:
                        continue
                break
        self._calibrated_at = time.monotonic()
        self._recalibrate_after = (min(self._recalibrate_after * 2, RECALIBRATE_MAX_S) if retrying
                                   else RECALIBRATE_MIN_S)
        rounds = min(len(samples[shape]) for shape in runs) if len(samples) == len(runs) else 0
        points = {size: statistics.median(samples[shape][:rounds] or samples[shape])
                  for size, shape in shapes.items() if shape in samples}
        if len(points) < MIN_CALIBRATED_SIZES:
            self._drift_steps = 0
            log.info("verify cost curve: calibration gave way after %d sizes; the line stays %.1f ms + %.2f ms "
                     "per token", len(points), self.intercept * 1000, self.slope * 1000)
            return
        self.fit(points)
        if rounds:  # every shape measured alike; else the last calibration's stands
            self.spread = {n_seqs: statistics.median(samples[shape][:rounds]) for n_seqs, shape in spread.items()}
            if attend is not None:
                self._calibrate_context(attend, min(CONTEXT_ROWS, 1 + max_draft), n_parallel > 1)
        if self._start_rate is None:
            self._start_rate = 1.0 / (self.intercept + self.slope)
        self.calibrations += 1
        self._recent.clear()
        self._candidate = None
        log.info("verify cost curve: %s (medians of %d rounds: %s; %.1f s)",
                 self.describe(), min(len(v) for v in samples.values()),
                 ", ".join(f"{n} tok {s * 1000:.1f} ms" for n, s in sorted(points.items())),
                 time.monotonic() - started)
        if self.spread:
            log.info("verify cost curve: one token each of %s", ", ".join(
                f"{k} sequences {s * 1000:.1f} ms" for k, s in sorted(self.spread.items())))

    def _calibrate_context(self, attend: Callable[[int, int], float | None], rows: int, paired: bool) -> None:
        """What a row costs more after each of CONTEXT_POINTS tokens of context than after none:
        `rows` rows of one sequence decoded after the context (the first decode after a new
        context unmeasured), the median over REPEATS of the difference to the same rows with no
        context, a row's share of it, never less than at a shorter context. `paired` (the engine
        has a second slot): each decode after the context is followed at once by one of a
        sequence of its own beside it (`attend(0, k)`), so a burst of load moves both alike;
        measured apart, a fresh clone's first start, right after its suite, once put 0.5 ms more
        on every point. Else the empty context is measured first. Stops at the first context that
        gives way or does not fit, or once CONTEXT_BUDGET_S went to them (a slow host computes
        1,024 tokens and 33 steps of 17 rows in several seconds, and a node measures before it
        serves); the points measured before it are kept (none: the last calibration's stand), a
        longer context priced along the last stretch measured."""
        started = time.monotonic()
        k = rows - 1
        alone: list[float] = []
        if not paired:
            alone = [t for t in (attend(0, k) for _ in range(REPEATS + 1)) if t is not None][1:]
            if len(alone) < REPEATS:
                return
        extra: dict[int, float] = {}
        for context in CONTEXT_POINTS:
            if extra and time.monotonic() - started > CONTEXT_BUDGET_S:
                break
            if attend(context, k) is None:
                break
            differences = []
            for i in range(REPEATS):
                at, empty = attend(context, k), (attend(0, k) if paired else alone[i])
                if at is None or empty is None:
                    break
                differences.append(at - empty)
            if len(differences) < REPEATS:
                break
            extra[context] = max(0.0, statistics.median(differences)) / rows
        if not extra:
            return
        self.context = _rising(extra)
        log.info("verify cost curve: a row after %s", ", ".join(
            f"{n} tokens of context {s * 1000:+.2f} ms" for n, s in sorted(self.context.items())))

    def plain_rate(self) -> float | None:
        """Tokens per second of plain single-stream decoding (one token a step) as the first
        calibration measured it, or None before one; refits and recalibrations leave it."""
        return self._start_rate

    def seconds(self, n_tokens: int) -> float:
        """The shape's seconds for a step of this many tokens times its bend, worked out once per
        size while the shape and the bends stand (the planner asks a few hundred times a step),
        times the scale."""
        n = max(1, n_tokens)
        if self._bent_of is not self.bends or self._shape_of is not self.shape:
            self._bent_at, self._bent_of, self._shape_of = {}, self.bends, self.shape
        bent = self._bent_at.get(n)
        if bent is None:
            bent = self._bent_at[n] = self.shape.seconds(n) * self.bend(n)
        return bent * self.scale

    def bend(self, n_tokens: int) -> float:
        """What a step of this many tokens costs against the shape: its calibrated bend, or its
        calibrated neighbours' on the same side of the tile, interpolated (the nearer one past
        the sizes calibrated; 1 with none)."""
        n = max(1, n_tokens)
        exact = self.bends.get(n)
        if exact is not None:
            return exact
        side = self.shape.off_tile(n)
        alike = [m for m in self.bends if self.shape.off_tile(m) == side and m != 1]
        below = max((m for m in alike if m < n), default=None)
        above = min((m for m in alike if m > n), default=None)
        if below is None or above is None:
            nearest = below if above is None else above
            return self.bends[nearest] if nearest is not None else 1.0
        w = (n - below) / (above - below)
        return self.bends[below] * (1 - w) + self.bends[above] * w

    def row_seconds(self) -> float:
        """What one more token with logits costs on the line, the staircase aside."""
        return self.slope * self.scale

    def context_seconds(self, context: int) -> float:
        """What a row with logits costs more after `context` tokens of its sequence than after
        none, scaled as the line is."""
        return self.attention(context) * self.scale

    def attention(self, context: int) -> float:
        """`context_seconds` unscaled: between the measured contexts interpolated (0 after none),
        past the last one along the last stretch."""
        if not self.context or context <= 0:
            return 0.0
        points = [(0, 0.0), *sorted(self.context.items())]
        for (n0, s0), (n1, s1) in zip(points, points[1:]):
            if context <= n1:
                return s0 + (s1 - s0) * (context - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = points[-2], points[-1]
        return s1 + (s1 - s0) * (context - n1) / (n1 - n0)

    def shed_seconds(self, n_seqs: int) -> float:
        """What a step of n_seqs sequences, one token each, costs less with one of them finished:
        as calibrated (`spread`), else a row on the line."""
        more, fewer = self.spread.get(n_seqs), self.spread.get(n_seqs - 1)
        if more is None or fewer is None:
            return self.row_seconds()
        return max(0.0, more - fewer) * self.scale

    def line(self) -> CostLine:
        """The line (and staircase) as it stands now, the scale included."""
        return self.shape.scaled(self.scale)

    def observe(self, n_tokens: int, seconds: float, attention: float = 0.0) -> None:
        """A decode-only step of n_tokens rows with logits took `seconds`; `attention`: what its
        rows cost more for their contexts, unscaled (`attention`), taken out in proportion, so
        the line and its scale stay those of the empty cache."""
        if self.fixed or seconds <= 0:
            return
        predicted = self.seconds(n_tokens) / self.scale
        if predicted > 0 and attention > 0:
            seconds *= predicted / (predicted + attention)
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
        """A candidate line through the recent steps' medians by size, their bends taken out;
        adopted when the window before gave one that agrees (a lasting change, not a burst). The
        bends stay the calibration's."""
        points = {n: statistics.median(d) / self.bend(n) for n, d in self._recent.items() if len(d) >= MIN_RECENT}
        candidate = self._recent_fit(points)
        if candidate is None:
            return
        previous, self._candidate = self._candidate, candidate
        if previous is None or abs(candidate.per_token - previous.per_token) > AGREE * max(previous.per_token, 1e-4):
            return
        before = (self.intercept * self.scale, self.slope * self.scale)
        self._adopt(candidate, points, self.bends)
        self.refits += 1
        if abs(self.slope - before[1]) > AGREE * max(before[1], 1e-4):
            log.info("verify cost curve refitted from recent steps: %.1f ms + %.2f ms per token (was %.1f + %.2f)",
                     self.intercept * 1000, self.slope * 1000, before[0] * 1000, before[1] * 1000)

    def _recent_fit(self, points: dict[int, float]) -> CostLine | None:
        """The curve through the recent steps' sizes. Steps seen in service may all sit on one
        side of the staircase (the planner avoids the costly sizes once it knows them), or never
        be a lone row (a busy batch): then the line is refitted through the sizes seen on the
        tile, and the tail and the lone row's discount measured before stay, moved with the
        host's speed."""
        keep_tail = self.tile > 1 and sum(1 for n in points if off_tile(self.tile, n)) < 2
        keep_solo = self.shape.solo > 0 and 1 not in points
        if not (keep_tail or keep_solo):
            return fit_steps(points)
        fitted = fit_steps({n: s for n, s in points.items() if not (keep_tail and off_tile(self.tile, n))})
        if fitted is None:
            return None
        moved = fitted.per_token / self.slope if self.slope > 0 else 1.0  # the host's speed moved it
        tile, tail = (self.tile, self.tail * moved) if keep_tail else (fitted.tile, fitted.tail)
        solo = self.shape.solo * moved if keep_solo else fitted.solo
        return CostLine(fitted.per_step, fitted.per_token, fitted.clamped, tile, tail, solo)

    @property
    def drifted(self) -> bool:
        """The host's speed has moved away from the calibrated line for a while: re-measure
        (backing off while it keeps drifting)."""
        return self._calibration_wanted(self._drift_steps >= DRIFT_STEPS)

    @property
    def due(self) -> bool:
        """Measure when next idle: the host drifted, or the curve was never measured (a
        calibration gave way to requests), backing off alike while attempts keep failing."""
        return self._calibration_wanted(self._drift_steps >= DRIFT_STEPS or not self.measured)

    def _calibration_wanted(self, reason: bool) -> bool:
        return (not self.fixed and reason
                and time.monotonic() - self._calibrated_at >= self._recalibrate_after)

    def describe(self) -> str:
        """The line as it stands, the calibrated sizes off it, and a row's cost after context."""
        off = ", ".join(f"{n} {b:.2f}x" for n, b in sorted(self.bends.items()) if b != 1.0)
        context = ", ".join(f"{n} {self.context_seconds(n) * 1000:+.2f} ms" for n in sorted(self.context))
        return (self.line().describe() + (f"; sizes measured off it: {off}" if off else "")
                + (f"; a row after so many tokens of context: {context}" if context else ""))

    def table(self) -> dict[int, float]:
        return {n: self.seconds(n) for n in (1, 2, 4, 8, 16, 32, 64)}


def _rising(context: dict[int, float]) -> dict[int, float]:
    """Context points with each extra cost at least that of a shorter context (a longer context
    never reads less); points at no context or below it left out."""
    rising, most = {}, 0.0
    for n, s in sorted(context.items()):
        if n > 0:
            most = max(most, s)
            rising[n] = most
    return rising


def _bends(shape: CostLine, points: dict[int, float]) -> dict[int, float]:
    """Each measured size's time against the shape, within BEND_LIMITS; 1 for sizes on it (within
    BEND_NOISE)."""
    bends: dict[int, float] = {}
    for n, seconds in points.items():
        on_shape = shape.seconds(n)
        if on_shape <= 0 or seconds <= 0:
            continue
        ratio = min(BEND_LIMITS[1], max(BEND_LIMITS[0], seconds / on_shape))
        bends[n] = ratio if abs(ratio - 1.0) > BEND_NOISE else 1.0
    return bends


def _shapes(n_parallel: int, max_draft: int) -> dict[int, tuple[int, int]]:
    """Step size -> (sequences, drafts each) for the PROBE_SIZES a batch of these can hold."""
    largest = n_parallel * (1 + max_draft)
    shapes: dict[int, tuple[int, int]] = {}
    for size in PROBE_SIZES:
        if size > largest:
            break
        if size <= 1 + max_draft:
            shapes[size] = (1, size - 1)
        elif size % n_parallel == 0 and size // n_parallel - 1 <= max_draft:
            shapes[size] = (n_parallel, size // n_parallel - 1)
    return shapes


def _spread(n_parallel: int) -> dict[int, tuple[int, int]]:
    """Sequences -> the step shape of that many sequences with one token each."""
    return {n_seqs: (n_seqs, 0) for n_seqs in range(1, n_parallel + 1)}


def _runs(shapes: dict[int, tuple[int, int]], spread: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """The step shapes a calibration round measures, each once: the sizes', then the spread's."""
    return list(dict.fromkeys([*shapes.values(), *spread.values()]))
