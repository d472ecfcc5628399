"""The controller: the engine's Speculator. Asks the sources, decides how much of a draft to
verify from what it costs and what it is expected to keep, and switches sources off and on.

Per source and per sequence it estimates p_i, the chance the draft token at position i is
kept given the ones before it were (a moving average per source, blended with the
sequence's own counts; a draft kept whole also raises the estimate of the position after
it, so lengths grow while drafts keep being kept), so a draft of length j is expected to yield E_j = sum of the
products p_1 .. p_i. A step is planned as a whole: it starts with every decoding sequence's
one token, and each sequence's draft length j is the one maximising the step's expected
tokens per second, (tokens so far + E_j) / cost(rows so far + j), from the measured verify
cost curve (costs.py). A draft that does not raise the whole batch's rate is not verified:
j = 0, the step is plain decoding, and drafts cost the other users nothing.

Under a grammar, every source's draft is cut where the grammar stops admitting it (a token
the grammar forbids can never be kept, so verifying it would only cost a row).

A source whose proposals were all judged not to pay SWITCH_OFF times in a row is switched
off (not even asked) and re-probed after a backoff in steps (doubling, up to BACKOFF_MAX):
the probe verifies a short draft so its estimates see fresh evidence; while they say it
pays it stays on. Both switches are logged with the numbers behind them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.engine.hooks import Draft, DraftSeq
from node.speculative.costs import CostCurve
from node.speculative.palimpsest import Palimpsest
from node.speculative.source import DraftSource
from node.speculative.stats import SpeculationStats

log = logging.getLogger(__name__)

PRIOR = 0.5           # p_i of a source nothing is known about yet (a source may declare its own `prior`)
PRIOR_WEIGHT = 4.0    # the source's estimate counts as this many observations for a new sequence
EMA = 0.1             # per-source moving average weight of one observation
SWITCH_OFF = 24       # proposals in a row judged not to pay
BACKOFF_START = 32    # steps before the first re-probe
BACKOFF_MAX = 4096
PROBE_TOKENS = 3
MARGIN = 1.02         # a draft must promise this much more throughput than none


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    max_draft: int = 16
    min_draft: int = 1
    n_parallel: int = 4


@dataclass(slots=True)
class _SourceState:
    source: DraftSource
    p: list[float]                      # per-position acceptance estimate
    on: bool = True
    idle: int = 0                       # proposals in a row that did not pay
    backoff: int = BACKOFF_START
    wake_at: int = 0                    # step at which an off source is probed
    probing: bool = False               # the next proposal is verified whatever the estimate says
    after_probe: bool = False           # judged once more after a probe: off at once if it does not pay


@dataclass(slots=True)
class _SeqState:
    reached: dict[str, list[int]] = field(default_factory=dict)
    kept: dict[str, list[int]] = field(default_factory=dict)


class Controller:
    """Implements node.engine.hooks.Speculator over a list of draft sources."""

    def __init__(self, sources: Sequence[DraftSource], config: ControllerConfig = ControllerConfig(), *,
                 costs: CostCurve | None = None) -> None:
        self.config = config
        self.costs = costs or CostCurve()
        self._sources = {s.name: _SourceState(s, [float(getattr(s, "prior", PRIOR))] * config.max_draft)
                         for s in sources}
        self.stats = SpeculationStats(list(self._sources), config.max_draft)
        self._seqs: dict[int, _SeqState] = {}
        self._step = 0
        self._rows = 0
        self._expected = 0.0
        self._n_decoding = 0
        self._this_step: list[tuple[str, int, int]] = []   # (source, drafted, accepted)

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(self._sources)

    def bind_vocabulary(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        """Hand the model's vocabulary to the sources that read text (Il Suggeritore's form rules)."""
        for state in self._sources.values():
            bind = getattr(state.source, "bind", None)
            if bind is not None:
                bind(piece, tokenize)

    def source(self, name: str) -> DraftSource | None:
        state = self._sources.get(name)
        return state.source if state is not None else None

    # -- Speculator -------------------------------------------------------------------------

    def calibrate(self, measure: Callable[[int, int], float | None]) -> None:
        self.costs.calibrate(measure, self.config.n_parallel, self.config.max_draft)

    def calibration_due(self) -> bool:
        return self.costs.drifted

    def begin(self, seq: DraftSeq) -> None:
        self._seqs[seq.key] = _SeqState()
        for state in self._sources.values():
            state.source.begin(seq)

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        self._seqs.pop(seq.key, None)
        for state in self._sources.values():
            state.source.end(seq, tokens)

    def start_step(self, n_decoding: int) -> None:
        self._step += 1
        self._rows = n_decoding
        self._expected = float(n_decoding)
        self._n_decoding = n_decoding
        self._this_step.clear()
        for state in self._sources.values():
            if isinstance(state.source, Palimpsest):
                state.source.ingest()
            if not state.on and self._step >= state.wake_at:
                state.on = state.probing = True

    def propose(self, seq: DraftSeq, context: Sequence[int], max_tokens: int) -> Draft | None:
        own = self._seqs.get(seq.key)
        if own is None:
            return None
        best: tuple[float, Draft, _SourceState] | None = None
        base = self._expected / self.costs.seconds(self._rows)
        for state in self._sources.values():
            if not state.on:
                continue
            ask = max_tokens
            making = state.source.cost_per_token
            if making > 0 and not state.probing:  # drafts cost time to make: ask only for what pays
                ask, _, _ = self._best_length(state, own, max_tokens)
                if ask == 0:
                    self._not_paying(state)
                    continue
            draft = state.source.propose(seq, context, ask)
            if draft is not None and seq.grammar is not None and draft.tokens:
                draft = _grammatical(draft, seq.grammar.valid(draft.tokens))
            if draft is None or not draft.tokens:
                continue
            if state.probing:  # verify a short draft regardless, so the estimates see fresh evidence
                j, rate = min(len(draft.tokens), PROBE_TOKENS), base * MARGIN
                state.probing, state.after_probe = False, True
            else:
                j, rate, _ = self._best_length(state, own, len(draft.tokens))
                if j == 0 or rate < base * MARGIN:
                    self._not_paying(state)
                    continue
                self._paying(state)
            if best is None or rate > best[0]:
                best = (rate, draft.head(j), state)
        if best is None:
            return None
        _, draft, state = best
        self._rows += len(draft.tokens)
        self._expected += self._expected_tokens(state, own, len(draft.tokens))
        return draft

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        state = self._sources.get(draft.source)
        if state is None:
            return
        drafted = len(draft.tokens)
        self.stats[draft.source].record(drafted, accepted)
        self._this_step.append((draft.source, drafted, accepted))
        for i in range(min(drafted, accepted + 1)):
            state.p[i] += EMA * ((1.0 if i < accepted else 0.0) - state.p[i])
        if accepted == drafted < len(state.p):  # all kept: the next position is likely kept too
            state.p[drafted] += EMA * (1.0 - state.p[drafted])
        own = self._seqs.get(seq.key)
        if own is not None:
            reached = own.reached.setdefault(draft.source, [0] * self.config.max_draft)
            kept = own.kept.setdefault(draft.source, [0] * self.config.max_draft)
            for i in range(min(drafted, accepted + 1)):
                reached[i] += 1
                kept[i] += i < accepted

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float) -> None:
        self.costs.observe(n_tokens, decode_s)
        if not self._this_step:
            return
        self.stats.steps_with_drafts += 1
        per_token_plain = self.costs.seconds(n_decoding) / max(1, n_decoding)
        for name, drafted, accepted in self._this_step:
            stats = self.stats[name]
            share = decode_s * drafted / max(1, n_tokens)
            state = self._sources.get(name)
            making = state.source.cost_per_token * drafted if state is not None else 0.0  # a draft model's own decodes
            stats.verify_s += share
            stats.make_s += making
            stats.saved_s += accepted * per_token_plain - share - making
        self._this_step.clear()

    # -- decisions ------------------------------------------------------------------------------

    def _estimates(self, state: _SourceState, own: _SeqState) -> list[float]:
        name = state.source.name
        reached, kept = own.reached.get(name), own.kept.get(name)
        if reached is None or kept is None:
            return state.p
        return [(kept[i] + PRIOR_WEIGHT * state.p[i]) / (reached[i] + PRIOR_WEIGHT) for i in range(len(state.p))]

    def _expected_tokens(self, state: _SourceState, own: _SeqState, j: int) -> float:
        total, chain = 0.0, 1.0
        for p in self._estimates(state, own)[:j]:
            chain *= p
            total += chain
        return total

    def _best_length(self, state: _SourceState, own: _SeqState, available: int) -> tuple[int, float, float]:
        """(draft length, step rate with it, expected tokens) maximising the step's tokens per second."""
        p = self._estimates(state, own)
        making = state.source.cost_per_token
        best_j, best_rate, best_gain = 0, self._expected / self.costs.seconds(self._rows), 0.0
        total, chain = 0.0, 1.0
        for j in range(1, min(available, self.config.max_draft) + 1):
            chain *= p[j - 1]
            total += chain
            if j < self.config.min_draft:
                continue
            rate = (self._expected + total) / (self.costs.seconds(self._rows + j) + making * j)
            if rate > best_rate:
                best_j, best_rate, best_gain = j, rate, total
        return best_j, best_rate, best_gain

    def _paying(self, state: _SourceState) -> None:
        state.idle = 0
        stats = self.stats[state.source.name]
        if state.after_probe:
            state.after_probe = False
            if not stats.on:
                log.info("speculation source %s switched on: a probe raised its acceptance by position to %s "
                         "(%d of %d draft tokens kept so far)", state.source.name,
                         " ".join(f"{x:.2f}" for x in state.p[:4]), stats.accepted, stats.drafted)
                stats.on = True
                stats.switched_on += 1
                state.backoff = BACKOFF_START

    def _not_paying(self, state: _SourceState) -> None:
        state.idle += 1
        if state.idle < SWITCH_OFF and not state.after_probe:
            return
        stats = self.stats[state.source.name]
        state.on = state.after_probe = False
        state.wake_at = self._step + state.backoff
        log.info("speculation source %s switched off: %d proposals in a row would not pay (acceptance "
                 "by position %s, %d of %d draft tokens kept so far); re-probed in %d steps",
                 state.source.name, state.idle, " ".join(f"{x:.2f}" for x in state.p[:4]),
                 stats.accepted, stats.drafted, state.backoff)
        stats.switched_off += 1
        stats.on = False
        state.backoff = min(BACKOFF_MAX, state.backoff * 2)
        state.idle = 0

    def state(self) -> dict[str, dict[str, object]]:
        """For /health: each source's switch state and estimates, and the cost curve."""
        return {
            name: {"on": state.on, "acceptance_by_position": [round(x, 3) for x in state.p[:8]],
                   "reprobe_in_steps": max(0, state.wake_at - self._step) if not state.on else 0,
                   "backoff_steps": state.backoff}
            for name, state in self._sources.items()
        }


def _grammatical(draft: Draft, n_valid: int) -> Draft | None:
    if n_valid >= len(draft.tokens):
        return draft
    if n_valid <= 0:
        return None
    return draft.head(n_valid)
