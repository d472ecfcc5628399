"""The controller: the engine's Speculator. Plans each step as a whole: which sequences'
drafts to verify, how long each, and how much of the step's token budget is left to prefill
beside them; switches sources off and on.

Estimates. Per source it estimates p_i, the chance the draft token at position i is kept
given the ones before it were: a moving average per source, kept apart for greedy and for
sampled sequences (a sampled sequence keeps a deterministic draft only where its own draw
agrees, so its acceptance is not greedy's) and by the class of the source's match (the
context tokens it matched, `Draft.match`: the Palimpsest's match length, the run prompt
lookup's n-gram ends; a long match predicts a long kept run, as in suffix decoding, and a
class of long matches no draft has been judged in yet starts from what the run says,
`_run_prior`), and apart again where the match is the sequence's own output (`Draft.echo`: a
text repeating a phrase of its own goes on as before far less often than a quote of its
prompt, and estimates learned on quotes made prose draft rows that were not kept), and
apart for replays (`Draft.replay`: a past answer to the same prompt, whose first estimates
start from a run of REPLAY_RUN agreeing tokens, so the second sight of an answer is drafted
in long runs at once; a seeded sampled sequence's replays apart again, starting from that run
too, since its draws are its seed's and a past answer of the same seed comes back token for
token). The source's estimate is blended with the sequence's own counts of that source's drafts (its hit
history); a draft kept whole also raises the estimate of the position after it, so lengths
grow while drafts keep being kept. Position i of a draft is then expected to yield g_i = p_1 * ... * p_i kept
tokens.

The row budget. On a CPU a step costs a fixed part and a part per row with logits (the cost
line, costs.py, fitted from the steps the engine runs), so a draft's position i costs one
row (plus the source's own making cost, and what a row costs more after the sequence's context
than at the line's empty cache, costs.py `context_seconds`; the step's decoding rows pay theirs
too) and buys g_i tokens. The planner takes every
sequence's best draft, ranks all their positions across sequences by kept tokens per
second of row, and of every count of positions taken in that order keeps the one that gives
the whole step the most expected tokens per second ((decoding tokens + kept drafts) / the
step's time on the cost curve, which may be a staircase: where the output projection works
in tiles of 4 rows, 8 rows cost what 5 do, so a plan fills a tile or adds nothing): rows go
to the drafts that buy most, wherever they are in the batch, and a sequence's draft length
is where its positions stop paying (it adapts per sequence and per match, never a fixed max).
A draining batch. While requests wait to join the batch, a token kept anywhere frees a slot
sooner, so every kept token is worth a plain token's share of the step. Once none waits, the
batch takes as many steps as its slowest sequence needs, and a kept token of a sequence that
will finish before it saves only the row it would have had later: kept tokens are weighed by
what they shorten (node/speculative/draining.py), so rows go to the sequences that bound the
batch and the others draft only where a row is nearly free. Where several bound it alike
(requests started together), it gets shorter by the least any of them keeps: their kept tokens
count as far as the weakest's, and a plan where each of them drafts to the same length is
weighed beside the ranked one.
A plan that does not beat plain decoding by MARGIN, or whose drafts do not buy their kept
tokens ROW_MARGIN faster than plain decoding makes tokens, verifies nothing. Drafts never
take the share of the step's token budget a waiting prompt is owed (PROMPT_SHARE, the
Speculator protocol's); the prefill gets what the drafts leave.

Under a grammar, every source's draft is cut where the grammar stops admitting it (a token
the grammar forbids can never be kept, so verifying it would only cost a row).

Hit history without rows. A proposal that is not verified is still evidence: the controller
follows it (a shadow, at most SHADOWS per source and sequence) against the tokens the
sequence goes on to generate, and each position it reaches counts as if verified: kept where
the generated token is the proposed one, rejected at the first that is not (for a greedy
sequence exactly what verification would have said, up to its near-tie rule; for a sampled
one the same chance, since plain sampling emits a deterministic draft's token with the
probability the rejection sampler keeps it). So a source whose drafts do not pay yet keeps
learning from every step: when a workload turns repetitive (a request the Palimpsest has
seen, text the prompt repeats) its estimates rise while the sequence decodes plainly, and
its drafts start paying within a few steps, on a host where a row costs half a step as on
one where it costs a tenth.

The planner's own time. Planning a step (the sources' proposals, the shadows, the weights of a
draining batch, the allocation) takes 0.1-0.5 ms of Python, where a step of four users decodes
in 11-16 ms; in a batch of prose where nothing pays, that is a step in thirty lost to plans that
verify nothing (four users' non-repetitive mix with no draft verified: 0.967x plain decoding).
So after QUIET_PLANS plans in a row that verify nothing the planner rests a step, then two, up
to REST_MAX, between plans (the same backoff as a source that costs time to ask); a plan that
verifies a draft ends the rest, and so does a sequence it has not planned for yet (a new
request: its past answer, if the Palimpsest holds one, is drafted at its first step). A resting
step verifies nothing and leaves the step's room to the prompts; its proposals are not made, so
no shadows start there (those already followed are judged at the next plan, on everything the
sequence generated meanwhile).

A source that costs nothing to ask is therefore always asked. A source that costs time to
ask (a draft model) and whose proposals were all judged not to pay SWITCH_OFF times in a row
is switched off (not even asked) and re-probed after a backoff in steps (doubling, up to
BACKOFF_MAX): the probe verifies a short draft so its estimates see fresh evidence; while
they say it pays it stays on. Both switches are logged with the numbers behind them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.engine.hooks import PROMPT_SHARE, Draft, DraftAsk, DraftSeq, StepPlan
from node.speculative.cost_store import CostStore
from node.speculative.costs import CostCurve
from node.speculative.draining import Draining, draft_return
from node.speculative.palimpsest import Palimpsest
from node.speculative.source import DraftSource
from node.speculative.stats import SpeculationStats

log = logging.getLogger(__name__)

PRIOR = 0.5           # p_i of a source nothing is known about yet (a source may declare its own `prior`)
PRIOR_WEIGHT = 4.0    # the source's estimate counts as this many observations for a new sequence
EMA = 0.1             # per-source moving average weight of one observation, once an estimate has seen many
PRIOR_COUNT = 2       # observations the starting estimate counts as: the first ones weigh 1/(PRIOR_COUNT + seen)
SWITCH_OFF = 24       # proposals in a row judged not to pay
BACKOFF_START = 32    # steps before the first re-probe
BACKOFF_MAX = 4096
PROBE_TOKENS = 3
MARGIN = 1.02         # a plan with drafts must promise this much more throughput than none
ROW_MARGIN = 0.25     # and its drafts must buy kept tokens this much faster than plain decoding makes them
ANY = -1              # the match class of the estimate over every match
SHADOWS = 8           # unverified proposals followed at once, per source and sequence
ENDINGS = 32          # sequences remembered for how often their max_tokens was their end
RUN_CLASS = 3         # the first match class (8+ tokens) whose fresh estimates start from the run's (`_run_prior`)
ECHO = 8              # added to the match class of a draft that matched the sequence's own output (`Draft.echo`)
ANY_ECHO = -2         # the estimate over every echo
REPLAY = 5            # the class of a past answer to the same prompt (`Draft.replay`), apart from every match length
SEEDED_REPLAY = 6     # the class of such a replay for a seeded sampled sequence
REPLAY_RUN = 128      # the agreeing run a replay's fresh estimates start from (`_run_prior`)
QUIET_PLANS = 4       # plans in a row that verify nothing before the planner rests between plans
REST_MAX = 4          # the longest rest, in steps


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    max_draft: int = 16
    min_draft: int = 1
    n_parallel: int = 4


@dataclass(slots=True)
class _SourceState:
    source: DraftSource
    prior: float
    # per-position acceptance estimates by (sampled, match class); (sampled, ANY) over every match
    p: dict[tuple[bool, int], list[float]] = field(default_factory=dict)
    seen: dict[tuple[bool, int], list[int]] = field(default_factory=dict)  # observations behind each estimate
    on: bool = True
    idle: int = 0                       # proposals in a row that did not pay
    backoff: int = BACKOFF_START
    wake_at: int = 0                    # step at which an off source is probed
    probing: bool = False               # the next proposal is verified whatever the estimate says
    after_probe: bool = False           # judged once more after a probe: off at once if it does not pay


@dataclass(slots=True)
class _Shadow:
    """A proposal not verified, followed against what the sequence generates next:
    tokens[i] predicts context[start + i]; `checked` positions are judged so far."""

    source: str
    tokens: tuple[int, ...]
    start: int
    kind: int  # its estimates (`_kind`)
    checked: int = 0
    verified: int = 0  # its first positions went to verification: judged on from there once they were kept


@dataclass(slots=True)
class _SeqState:
    reached: dict[str, list[int]] = field(default_factory=dict)
    kept: dict[str, list[int]] = field(default_factory=dict)
    shadows: list[_Shadow] = field(default_factory=list)
    start: int = -1  # the context's length when the sequence first asked
    asked: int = 0   # steps it asked in
    left: int = 0    # the tokens it might still generate when it last asked
    context: int = 0  # its context's length then
    promise: float = 0.0  # tokens a step its best proposal promised when it last asked (1 + its expected kept)

    def pace(self, context: int) -> float:
        """Tokens per step so far (one before the second step: a step gives at least one)."""
        return (context - self.start + 1) / max(1, self.asked)


class Controller:
    """Implements node.engine.hooks.Speculator over a list of draft sources."""

    def __init__(self, sources: Sequence[DraftSource], config: ControllerConfig = ControllerConfig(), *,
                 costs: CostCurve | None = None, store: CostStore | None = None) -> None:
        self.config = config
        self.costs = costs or CostCurve()
        self._store = store  # the curve measured at an earlier start, and where this one's goes
        kept = store.load() if store is not None and not self.costs.measured else None
        if kept:
            self.costs.restore(*kept)
            log.info("verify cost curve as measured at an earlier start: %s", self.costs.describe())
        self._sources = {s.name: _SourceState(s, float(getattr(s, "prior", PRIOR))) for s in sources}
        self.stats = SpeculationStats(list(self._sources), config.max_draft)
        self._seqs: dict[int, _SeqState] = {}
        self._endings: collections.deque[bool] = collections.deque(maxlen=ENDINGS)  # ran to max_tokens?
        self._step = 0
        self._this_step: list[tuple[str, int, int]] = []   # (source, drafted, accepted)
        self._piece: Callable[[int], bytes] | None = None  # the vocabulary's pieces, once bound
        self._attending = 0.0  # this step's decoding rows' attention over their contexts (`_seconds`)
        self._quiet = 0        # plans in a row that verified nothing
        self._rest = 0         # the length of the last rest between plans, in steps
        self._rest_left = 0    # steps of the rest still to go
        self._planned: frozenset[int] = frozenset()  # the sequences of the last plan

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(self._sources)

    def bind_vocabulary(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        """Hand the model's vocabulary to the sources that read text (Il Suggeritore's form rules)
        and keep its pieces for cutting structured output's drafts at a sentence's end."""
        self._piece = piece
        for state in self._sources.values():
            bind = getattr(state.source, "bind", None)
            if bind is not None:
                bind(piece, tokenize)

    def source(self, name: str) -> DraftSource | None:
        state = self._sources.get(name)
        return state.source if state is not None else None

    # -- Speculator -------------------------------------------------------------------------

    def calibrate(self, measure: Callable[[int, int], float | None],
                  attend: Callable[[int, int], float | None] | None = None) -> None:
        done = self.costs.calibrations
        self.costs.calibrate(measure, self.config.n_parallel, self.config.max_draft, attend=attend)
        if self._store is not None and self.costs.calibrations > done:
            self._store.save(self.costs.points, self.costs.spread, self.costs.context)

    def calibration_due(self) -> bool:
        """The host's speed moved, or the curve was never measured (the first calibration gave
        way to requests, and no earlier start kept one)."""
        return self.costs.due

    def begin(self, seq: DraftSeq) -> None:
        self._seqs[seq.key] = _SeqState()
        for state in self._sources.values():
            state.source.begin(seq)

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        own = self._seqs.pop(seq.key, None)
        if own is not None and own.asked:  # it generated all it had left at its last ask: it ran to its limit
            self._endings.append(len(tokens) - own.context >= own.left)
        for state in self._sources.values():
            state.source.end(seq, tokens)

    def plan(self, n_decoding: int, asks: Sequence[DraftAsk], prefill: int, budget: int,
             draining: int | None = None, refill: float = 0.0) -> StepPlan:
        self._step += 1
        self._this_step.clear()
        for state in self._sources.values():
            if isinstance(state.source, Palimpsest):
                state.source.ingest()
            if not state.on and self._step >= state.wake_at:
                state.on = state.probing = True
        for ask in asks:
            own = self._seqs.get(ask.seq.key)
            if own is not None:
                own.start = len(ask.context) if own.start < 0 else own.start
                own.asked += 1
                own.left, own.context = ask.left, len(ask.context)
        keys = frozenset(ask.seq.key for ask in asks)
        if self._resting(keys):
            return StepPlan({}, min(prefill, budget), {})
        owed = min(prefill, int(budget * PROMPT_SHARE))  # a waiting prompt's share of the step
        rows_left = max(0, budget - owed)
        n = max(1, n_decoding)
        row_s = max(self.costs.row_seconds(), 1e-9)  # a row on the line; the staircase is priced per plan
        attending = {ask.seq.key: self.costs.context_seconds(len(ask.context)) for ask in asks}  # a row's, by sequence
        # the decoding rows' attention over their contexts (those that do not ask: as the others)
        total = sum(attending.values())
        self._attending = total + (n - len(attending)) * total / len(attending) if attending else 0.0
        plain = n / self._seconds(n)  # plain decoding's tokens per second of this step
        chosen: list[_Option] = []
        proposed: list[_SourceState] = []
        worthy: set[str] = set()  # sources whose draft for some sequence beat plain decoding
        hints: dict[int, int] = {}  # the next token a source proposed, by sequence
        proposals: list[tuple[DraftAsk, _SeqState, Draft, int]] = []  # each draft proposed, its kind: the shadows
        promised = {key: own.promise for key, own in self._seqs.items() if own.promise > 0}  # at the step before
        drain = self._draining(n, asks, draining, row_s, plain, promised, refill)
        for ask in asks:
            own = self._seqs.get(ask.seq.key)
            if own is None:
                continue
            self._follow(ask, own)
            room = min(ask.room, self.config.max_draft)
            if room <= 0:
                continue
            option = self._best_option(ask, own, room, row_s + attending[ask.seq.key], plain, n, proposed,
                                       worthy, hints, proposals,
                                       drain.worth(ask.seq.key) if drain is not None else 1.0,
                                       drain.worth_bound() if drain is not None and ask.seq.key in drain.lifted
                                       else None)
            if option is not None:
                chosen.append(option)
                hints[ask.seq.key] = int(option.draft.tokens[0])
        # a step where no sequence has a draft worth a row allocates nothing
        drafts, rows = self._allocate(chosen, n, row_s, plain, rows_left) if chosen else ({}, 0)
        if chosen and drain is not None:
            drafts, rows = self._drain_plan(chosen, drafts, drain, n, row_s, plain, rows_left)
            unkept = drain.lifted - set(drafts)  # promises the plan does not act on
            again = self._draining(n, asks, draining, row_s, plain,
                                   {key: v for key, v in promised.items() if key not in unkept},
                                   refill) if unkept else None
            if again is not None and again.bound != drain.bound:
                for o in chosen:
                    o.reweigh(drain.worth(o.seq.key), again.worth(o.seq.key))
                drafts, rows = self._allocate(chosen, n, row_s, plain, rows_left)
                drafts, rows = self._drain_plan(chosen, drafts, again, n, row_s, plain, rows_left)
        for ask, own, draft, kind in proposals:
            verifying = drafts.get(ask.seq.key)
            head = len(verifying.tokens) if verifying is not None and verifying.source == draft.source else 0
            if head < len(draft.tokens):
                self._shadow(own, draft, kind, len(ask.context), head)
        paid = {o.state.source.name for o in chosen if o.seq.key in drafts}
        probed = {o.state.source.name for o in chosen if o.forced}
        for state in proposed:  # a probe is judged by the proposal after it, once its drafts were verified
            if state.source.name in probed:
                continue
            if state.source.name in paid or (drafts and state.source.name in worthy):
                self._paying(state)
            else:
                self._not_paying(state)
        self._planned_for(keys, bool(drafts))
        return StepPlan(drafts, max(0, min(prefill, budget - rows)),
                        {key: token for key, token in hints.items() if key not in drafts})

    def _resting(self, keys: frozenset[int]) -> bool:
        """Whether this step goes unplanned: a rest after plans that verified nothing, which a
        sequence not in the last plan ends (the module docstring, the planner's own time)."""
        if self._rest_left > 0 and keys <= self._planned:
            self._rest_left -= 1
            self.stats.steps_rested += 1
            return True
        self._rest_left = 0
        return False

    def _planned_for(self, keys: frozenset[int], verified: bool) -> None:
        """After a plan: a draft verified ends the quiet; QUIET_PLANS without one start a rest,
        each further one without one doubles it, up to REST_MAX."""
        self._planned = keys
        if verified:
            self._quiet = self._rest = 0
            return
        self._quiet += 1
        if self._quiet >= QUIET_PLANS:
            self._rest = min(REST_MAX, 2 * self._rest or 1)
            self._rest_left = self._rest

    def _drain_plan(self, chosen: list[_Option], drafts: dict[int, Draft], drain: Draining, n: int, row_s: float,
                    plain: float, rows_left: int) -> tuple[dict[int, Draft], int]:
        """The plan once no request waits: the bound gets ahead as far as the least of it, so plan
        again on what it drafts, then weigh the bound drafting to one length (`Draining.level`)."""
        for _ in range(len(drain.bound) + 1):
            if not drain.together(chosen, {key: len(d.tokens) for key, d in drafts.items()}):
                break
            drafts, _ = self._allocate(chosen, n, row_s, plain, rows_left)
        return drain.level(chosen, drafts, n, row_s, self._pays(n), rows_left, self._seconds)

    def _draining(self, n: int, asks: Sequence[DraftAsk], draining: int | None, row_s: float,
                  plain: float, promised: dict[int, float], refill: float = 0.0) -> Draining | None:
        """What a kept token of each asking sequence is worth once no request waits
        (node/speculative/draining.py; None while one does: then every one is worth 1). The
        weights count in proportion to how often the last ENDINGS sequences ran to their
        max_tokens (Laplace's rule: a half with no history), and to the chance that the batch's
        end is the end of its work, 1 - `refill` (node/engine/refill.py: where clients send
        their next request as each answer comes, a token kept anywhere brings one in sooner, as
        while requests wait). `promised`: the tokens a step each sequence's drafts promised
        when it last asked.

        `plan` leaves out the promise of a sequence that the plan made on it gives no draft.
        Its promise took it out of the bound (`Draining.lifted`), so its kept tokens were worth
        their rows alone and no rows went to it: a pace nobody acts on. Counted anyway, four
        requests started together, three with long matches, gave every row to the one taken for
        the bound, then to the next, in turn, while the batch went at the pace of the fourth,
        which had nothing to draft. So `plan` plans again without those promises."""
        paces = {ask.seq.key: own.pace(len(ask.context)) for ask in asks
                 for own in [self._seqs.get(ask.seq.key)] if own is not None}
        binding = (sum(self._endings) + 1) / (len(self._endings) + 2) * (1.0 - refill)
        return Draining.of(asks, draining, n, row_s, plain, paces, binding, promised, self.costs.shed_seconds)

    def _best_option(self, ask: DraftAsk, own: _SeqState, room: int, row: float, plain: float, n: int,
                     proposed: list[_SourceState], worthy: set[str], hints: dict[int, int],
                     proposals: list[tuple[DraftAsk, _SeqState, Draft, int]], worth: float = 1.0,
                     bound_worth: float | None = None) -> _Option | None:
        """The sequence's draft worth most: the most kept tokens beyond what its rows would buy
        at plain decoding's rate (a probing source's draft whatever it is worth); each kept
        token counts `worth` tokens of plain decoding (`_draining`). A sequence whose promise
        took it out of the bound keeps its option where it would pay at `bound_worth`, as the
        plan may count it in the bound again (`_draining`'s `unkept`). A source that
        costs nothing to ask is asked for one token more than the room: the token after the
        draft's last becomes its hint (`Draft.after`). The first proposal's first token is the
        sequence's hint in `hints` should no draft of it be verified. `row`: the seconds one of
        its rows costs, its attention over its context included."""
        best: _Option | None = None
        own.promise = 1.0  # and more below, by what its best proposal is expected to keep, worth aside
        for state in self._sources.values():
            if not state.on:
                continue
            making = state.source.cost_per_token
            ask_k = room
            if making > 0 and not state.probing:  # drafts cost time to make: ask only for what pays
                ask_k = self._paying_length(self._gains(state, own, ask.seq.sampled, ANY, room, worth),
                                            row + making, n)
                if ask_k == 0:
                    if state not in proposed:
                        proposed.append(state)
                    continue
            draft = state.source.propose(ask.seq, ask.context, ask_k + 1 if making <= 0 else ask_k)
            if draft is not None and ask.seq.grammar is not None and draft.tokens:
                draft = _grammatical(draft, min(ask.seq.grammar.valid(draft.tokens),
                                                _sentence_end(draft.tokens, self._piece)))
            if draft is None or not draft.tokens:
                continue
            if state not in proposed:
                proposed.append(state)
            hints.setdefault(ask.seq.key, int(draft.tokens[0]))
            kind = _kind(draft, ask.seq)
            proposals.append((ask, own, draft, kind))
            draft = draft.head(room)
            gains = self._gains(state, own, ask.seq.sampled, kind, len(draft.tokens), worth)
            if worth > 0:
                own.promise = max(own.promise, 1.0 + sum(gains) / worth)
            cost = row + making
            if state.probing:  # verify a short draft regardless, so the estimates see fresh evidence
                j = min(len(draft.tokens), PROBE_TOKENS)
                state.probing, state.after_probe = False, True
                return _Option(ask.seq, state, draft.head(j), gains[:j], cost, j)
            surplus, value, scale = 0.0, 0.0, max(worth, bound_worth or 0.0) / worth if worth > 0 else 1.0
            for g in gains:
                surplus += g * scale - plain * cost
                value = max(value, surplus)
            if value > 0:
                worthy.add(state.source.name)  # it pays, whether or not another source's draft pays more
                if best is None or value > best.value:
                    best = _Option(ask.seq, state, draft, gains, cost, 0, value)
        return best

    def _paying_length(self, gains: list[float], cost: float, n: int) -> int:
        """Positions of one draft, alone in a step of n decoding tokens, that raise its rate."""
        tokens, seconds = float(n), self._seconds(n)
        for j, g in enumerate(gains):
            if g / cost <= tokens / seconds:
                return j
            tokens, seconds = tokens + g, seconds + cost
        return len(gains)

    def _allocate(self, options: list[_Option], n: int, row_s: float, plain: float,
                  rows_left: int) -> tuple[dict[int, Draft], int]:
        """Rows to draft positions, across sequences: the positions ranked by kept tokens per
        second of row, and of every count of them taken in that order the one giving the step
        the most expected tokens per second, priced on the cost curve as a whole (on a
        staircase, 4 more rows can cost what 1 does, so the best count sits on a tile);
        (drafts by sequence key, rows taken)."""
        tokens, making, rows = float(n), 0.0, 0
        taken = {id(o): o.forced for o in options}
        for o in options:  # probes go in whatever they are worth
            tokens += sum(o.gains[:o.forced])
            making += (o.cost - row_s) * o.forced
            rows += o.forced
        ranked = sorted(((o.gains[i] / o.cost, i, k, o) for k, o in enumerate(options) if not o.forced
                         for i in range(len(o.gains))), key=lambda item: (-item[0], item[1], item[2]))
        order: list[tuple[_Option, int]] = []
        reach = dict(taken)
        for _, i, _, o in ranked:  # equal worth: earlier positions first, so rows spread over sequences
            if rows + len(order) >= rows_left:
                break
            if reach[id(o)] != i:  # a later position of a draft whose earlier one did not go in
                continue
            reach[id(o)] = i + 1
            order.append((o, i))
        best, best_rate = 0, tokens / (self._seconds(n + rows) + making)
        pays, base = self._pays(n), self._seconds(n)
        for m, (o, i) in enumerate(order, 1):
            tokens += o.gains[i]
            making += o.cost - row_s
            seconds = self._seconds(n + rows + m) + making
            rate = tokens / seconds
            if rate > best_rate and (rows > 0 or pays(tokens - n, seconds - base)):  # probes in: rate alone
                best, best_rate = m, rate
        for o, i in order[:best]:
            taken[id(o)] = i + 1
        floor = self.config.min_draft  # a draft cut shorter than this (probes aside) is left out
        lengths = {o.seq.key: j for o in options if (j := taken[id(o)]) and (o.forced or j >= floor)}
        drafts = {o.seq.key: o.draft.head(lengths[o.seq.key]) for o in options if o.seq.key in lengths}
        if drafts and not any(o.forced for o in options) and \
                not pays(*draft_return(options, lengths, n, row_s, self._seconds)):
            return {}, 0
        return drafts, sum(lengths.values())

    def _seconds(self, n_tokens: int) -> float:
        """A step of this many rows with logits on the cost curve, with the step's decoding rows'
        attention over their contexts (`plan`; a draft row's own is in its option's cost)."""
        return self.costs.seconds(n_tokens) + self._attending

    def _pays(self, n: int) -> Callable[[float, float], bool]:
        """Whether drafts that keep `kept` tokens (plain tokens' worth) and add `extra` seconds
        to a step of n decoding rows beat plain decoding: the step's rate by MARGIN, and the
        drafts' own rate (kept tokens over their seconds) by ROW_MARGIN. The second bar is for
        drafts that are worth little each, such as those of sequences ahead of the one that
        bounds a draining batch: their estimates are the highest of many noisy ones (the plan
        picks them for it), so a plan that only just beats plain decoding on them loses on the
        run."""
        base = self._seconds(n)
        plain = n / base

        def pays(kept: float, extra: float) -> bool:
            return (n + kept) / (base + extra) >= plain * MARGIN and kept >= plain * (1 + ROW_MARGIN) * extra
        return pays

    def verified(self, seq: DraftSeq, draft: Draft, accepted: int) -> None:
        state = self._sources.get(draft.source)
        if state is None:
            return
        drafted = len(draft.tokens)
        self.stats[draft.source].record(drafted, accepted)
        self._this_step.append((draft.source, drafted, accepted))
        own = self._seqs.get(seq.key)
        kind = _kind(draft, seq)
        for i in range(min(drafted, accepted + 1)):
            self._observe(state, own, seq.sampled, kind, i, i < accepted)
        if accepted == drafted:  # all kept: the next position is likely kept too
            for match_class in _classes(kind):
                self._learn(state, seq.sampled, match_class, drafted, 1.0)

    def _observe(self, state: _SourceState, own: _SeqState | None, sampled: bool, kind: int, i: int,
                 kept: bool) -> None:
        """Position i of one of the source's drafts was reached, and kept or not: the source's
        estimates for this kind of sequence and match (`_kind`), and the sequence's own counts."""
        for match_class in _classes(kind):
            self._learn(state, sampled, match_class, i, 1.0 if kept else 0.0)
        if own is not None and i < self.config.max_draft:
            name = state.source.name
            own.reached.setdefault(name, [0] * self.config.max_draft)[i] += 1
            own.kept.setdefault(name, [0] * self.config.max_draft)[i] += kept

    def _learn(self, state: _SourceState, sampled: bool, match_class: int, i: int, outcome: float) -> None:
        """Move estimate i of a table toward one outcome: by 1/(PRIOR_COUNT + observations so far)
        while it has seen few (the mean of what it saw, its start counting PRIOR_COUNT), then by
        EMA. A fixed EMA from the start weighed the starting estimate as ten observations: a
        source whose drafts were kept 95% of the time was still put at 0.8 after ten of them, and
        a fresh node verified 1-3 tokens of drafts it then kept for 17."""
        p = self._table(state, sampled, match_class)
        if i >= len(p):
            return
        seen = state.seen.setdefault((sampled, match_class), [0] * len(p))
        p[i] += max(EMA, 1.0 / (PRIOR_COUNT + seen[i] + 1)) * (outcome - p[i])
        seen[i] += 1

    def _shadow(self, own: _SeqState, draft: Draft, kind: int, start: int, verified: int) -> None:
        """Follow a proposal past what the step verifies of it (one more of its source's shadows
        for the sequence): a draft cut short by the planner tells, once kept, whether its
        further positions would have been kept too."""
        if sum(1 for s in own.shadows if s.source == draft.source) < SHADOWS:
            own.shadows.append(_Shadow(draft.source, tuple(draft.tokens), start, kind, verified, verified))

    def _follow(self, ask: DraftAsk, own: _SeqState) -> None:
        """Judge the sequence's shadows on the tokens it generated since they were proposed; a
        shadow ends at its first miss or its last token."""
        if own.shadows:
            own.shadows = [shadow for shadow in own.shadows if self._judge(shadow, ask, own)]

    def _judge(self, shadow: _Shadow, ask: DraftAsk, own: _SeqState) -> bool:
        """Count the positions of one shadow that the context now reaches; whether it lives on."""
        state = self._sources.get(shadow.source)
        context, length = ask.context, len(ask.context)
        if state is None:
            return False
        if shadow.verified:
            head = shadow.start + shadow.verified
            if head > length:
                return True
            # judged on only where verification kept the whole head (its outcome is counted there)
            if tuple(int(t) for t in context[shadow.start:head]) != shadow.tokens[:shadow.verified]:
                return False
            shadow.verified = 0
        while shadow.checked < len(shadow.tokens) and shadow.start + shadow.checked < length:
            i = shadow.checked
            kept = int(context[shadow.start + i]) == shadow.tokens[i]
            self._observe(state, own, ask.seq.sampled, shadow.kind, i, kept)
            shadow.checked += 1
            if not kept:
                return False
        return shadow.checked < len(shadow.tokens)

    def step_done(self, n_decoding: int, n_tokens: int, decode_s: float,
                  spans: Sequence[tuple[int, int]] = ()) -> None:
        self.costs.observe(n_tokens, decode_s, sum(rows * self.costs.attention(context) for context, rows in spans))
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

    def _table(self, state: _SourceState, sampled: bool, match_class: int) -> list[float]:
        """The source's per-position estimates for greedy or sampled sequences and a match class
        (a class seen for the first time starts from the estimates over every match, or every
        echo for an echo's class (quotes teach nothing of echoes), raised for a greedy
        sequence's long matches and a seeded one's replays to what the matched run says
        (`_run_prior`); greedy or sampled seen for the first time from the other's, then each
        learns from its own)."""
        table = state.p.get((sampled, match_class))
        if table is None:
            if match_class in (ANY, ANY_ECHO):  # no evidence for this kind yet: start from the other kind's, if any
                other = state.p.get((not sampled, match_class))
                table = list(other) if other is not None else [state.prior] * self.config.max_draft
            else:
                table = list(self._table(state, sampled, ANY_ECHO if match_class >= ECHO else ANY))
                if match_class == SEEDED_REPLAY or (not sampled and match_class % ECHO >= RUN_CLASS):
                    table = [max(p, run) for p, run in zip(table, _run_prior(match_class % ECHO, len(table)))]
            state.p[(sampled, match_class)] = table
        return table

    def _gains(self, state: _SourceState, own: _SeqState, sampled: bool, kind: int, j: int,
               worth: float = 1.0) -> list[float]:
        """Expected kept tokens of each of a draft's first j positions: the products p_1 .. p_i of
        the source's estimates for this kind of sequence and match, blended with the sequence's
        own counts; each counted as `worth` tokens of plain decoding (`_draining`)."""
        name = state.source.name
        p = self._table(state, sampled, kind)
        reached, kept = own.reached.get(name), own.kept.get(name)
        gains, chain = [], 1.0
        for i in range(min(j, len(p))):
            estimate = p[i] if reached is None or kept is None else \
                (kept[i] + PRIOR_WEIGHT * p[i]) / (reached[i] + PRIOR_WEIGHT)
            chain *= estimate
            gains.append(chain * worth)
        return gains

    def _paying(self, state: _SourceState) -> None:
        state.idle = 0
        stats = self.stats[state.source.name]
        if state.after_probe:
            state.after_probe = False
            if not stats.on:
                log.info("speculation source %s switched on: a probe raised its acceptance by position to %s "
                         "(%d of %d draft tokens kept so far)", state.source.name,
                         _by_position(state), stats.accepted, stats.drafted)
                stats.on = True
                stats.switched_on += 1
                state.backoff = BACKOFF_START

    def _not_paying(self, state: _SourceState) -> None:
        if state.source.cost_per_token <= 0 and not state.after_probe:
            return  # free to ask: its shadows keep its estimates current, nothing to save by not asking
        state.idle += 1
        if state.idle < SWITCH_OFF and not state.after_probe:
            return
        stats = self.stats[state.source.name]
        state.on = state.after_probe = False
        state.wake_at = self._step + state.backoff
        log.info("speculation source %s switched off: %d proposals in a row would not pay (acceptance "
                 "by position %s, %d of %d draft tokens kept so far); re-probed in %d steps",
                 state.source.name, state.idle, _by_position(state), stats.accepted, stats.drafted, state.backoff)
        stats.switched_off += 1
        stats.on = False
        state.backoff = min(BACKOFF_MAX, state.backoff * 2)
        state.idle = 0

    def planner_state(self) -> dict[str, int]:
        """For /health: steps rested so far, plans in a row that verified nothing, the rest's steps left."""
        return {"steps_rested": self.stats.steps_rested, "quiet_plans": self._quiet, "rest_steps_left": self._rest_left}

    def state(self) -> dict[str, dict[str, object]]:
        """For /health: each source's switch state and estimates, and the cost curve."""
        return {
            name: {"on": state.on,
                   "acceptance_by_position": [round(x, 3) for x in self._table(state, False, ANY)[:8]],
                   "sampled_acceptance_by_position": [round(x, 3) for x in self._table(state, True, ANY)[:8]],
                   "reprobe_in_steps": max(0, state.wake_at - self._step) if not state.on else 0,
                   "backoff_steps": state.backoff}
            for name, state in self._sources.items()
        }


def _grammatical(draft: Draft, n_valid: int) -> Draft | None:
    """The draft cut where the grammar stops admitting it, or where a sentence ends
    (`_sentence_end`); no hint past the cut (the token there is not the draft's to offer)."""
    if n_valid >= len(draft.tokens):
        return draft
    if n_valid <= 0:
        return None
    return dataclasses.replace(draft.head(n_valid), after=None)


def _sentence_end(tokens: Sequence[int], piece: Callable[[int], bytes] | None) -> int:
    """Where structured output's draft stops: before a full stop that ends a sentence (a "."
    token and then one that starts with a space or a newline), else its length. A draft copying
    a value out of a document runs on into the document's next sentence, where the output closes
    its string instead: `"phone":"01632 960 118` drafted on with ". Her manager is Tom Harlow",
    six rows of which none was kept. A "." inside a value (an e-mail address, a decimal) is not
    followed by a space; JSON has no full stop outside its strings. Unbound (no pieces): no cut."""
    if piece is not None:
        for i in range(len(tokens) - 1):
            if piece(int(tokens[i])) == b"." and piece(int(tokens[i + 1]))[:1] in (b" ", b"\n"):
                return i
    return len(tokens)


def _classes(kind: int) -> set[int]:
    """The estimates a draft of this kind (`_kind`) informs: over every match, over every echo
    for an echo, and its own class."""
    return {ANY, kind, ANY_ECHO} if kind >= ECHO else {ANY, kind}


def _kind(draft: Draft, seq: DraftSeq) -> int:
    """The estimates a draft is judged by: its match class (ANY where the source does not say),
    apart (ECHO more) where the match is the sequence's own output; a replay's own (REPLAY), and
    for a seeded sampled sequence apart again (SEEDED_REPLAY): its draws are keyed by its seed
    and position (node/engine/sampling.py `uniform`), so a past answer it drew with the same
    seed comes back token for token, as a greedy one does, where an unseeded draw keeps a
    replayed token only with its probability."""
    if draft.replay:
        seeded = seq.sampled and seq.sampling is not None and seq.sampling.seed is not None
        return SEEDED_REPLAY if seeded else REPLAY
    if draft.match <= 0:
        return ANY
    return _match_class(draft.match) + (ECHO if draft.echo else 0)


def _run_prior(match_class: int, n: int) -> list[float]:
    """What a run of matched tokens says of its continuation before any draft of its class was
    judged: a source whose text agreed with the context for m tokens in a row (m the class's
    shortest match) is taken to go on agreeing by Laplace's rule of succession, position i
    kept with chance (m + i + 1) / (m + i + 2) given the ones before it, so the first k all
    with chance (m + 1) / (m + k + 1): the draft length grows with the match, as suffix
    decoding's rule has it, and a fresh node drafts a long run of a past answer at once
    instead of growing its drafts by half again a step. Only from RUN_CLASS on: a run of a few
    tokens is common in any text (a frequent phrase), one of 8 or more rarely by chance. For a
    greedy sequence only: a sampled one keeps a token only where its own draw agrees, which
    the match does not tell. A replay (`REPLAY`: a past answer to the same prompt, agreeing with
    the prompt's tail and all the sequence wrote) counts as a run of REPLAY_RUN: its first 16
    tokens all kept with chance 0.89, where a match of 16 says 0.52. So does a seeded sampled
    sequence's replay (`SEEDED_REPLAY`), its draws being its seed's: an answer drawn with
    another seed parts from it within a few tokens, and its estimates learn that."""
    m = REPLAY_RUN if match_class in (REPLAY, SEEDED_REPLAY) else 1 << match_class
    return [(m + i + 1) / (m + i + 2) for i in range(n)]


def _match_class(match: int) -> int:
    """A source's match length in classes: 0 unknown, 1: 1-3 tokens, 2: 4-7, 3: 8-15, 4: 16 and more."""
    if match <= 0:
        return 0
    return min(4, max(1, match.bit_length() - 1))


def _by_position(state: _SourceState) -> str:
    """The first positions' estimates, greedy and sampled, for the switch logs."""
    return "; ".join(f"{'sampled' if sampled else 'greedy'} " + " ".join(f"{x:.2f}" for x in p[:4])
                     for (sampled, cls), p in sorted(state.p.items()) if cls == ANY) or "none yet"


@dataclass(slots=True)
class _Option:
    """One sequence's best draft for the step: its positions' expected kept tokens and row cost."""

    seq: DraftSeq
    state: _SourceState
    draft: Draft
    gains: list[float]
    cost: float       # seconds one of its rows costs (a row of the step + the source's making)
    forced: int = 0   # positions verified whatever they are worth (a probe)
    value: float = 0.0
    chances: list[float] | None = None  # each position's chance to be kept (node/speculative/draining.py)
    least: float | None = None          # the least kept by the bound its gains were last weighed for

    def reweigh(self, worth: float, now: float) -> None:
        """Its kept tokens, counted `worth` plain tokens each, are now worth `now`."""
        chances = self.chances if self.chances is not None else [g / worth for g in self.gains]
        self.gains, self.chances, self.least = [p * now for p in chances], None, None

