"""What a kept draft token is worth in a batch that no request waits to join.

While requests wait, a token kept anywhere shortens the batch's work by a share of a step (a
slot frees sooner for the next request): every kept token is worth a plain token, and the
planner (node/speculative/controller.py) needs nothing from here. Once none waits, the batch
lasts as many steps as its slowest sequence needs. A kept token replaces a row its sequence
would have had later, and shortens the batch only if that sequence bounds it. The bound is the
sequences whose steps still to go (the tokens they may still generate, at the pace they kept
so far) are within a step of the most. A token kept by one of k of them is worth its row plus
1/k of the step's fixed part, as far as the other k - 1 get ahead too (`Draining.together`).
The others' kept tokens are worth their rows alone, so their drafts go in only where a row is
nearly free (a tile's spare rows) or kept almost surely. Their row is the one a later step sheds
once such a sequence has finished: what a step of m sequences costs less with m - 1, as the
calibration measured it (`spare`; costs.py `shed_seconds`), not the line's slope, where m is
the sequences still running when it ends: itself and those expected to end after it (the
batch's tail loses its sequences one by one, the one ending first at a step of all of them,
the one ending last before the bound at a step of two). Where the kernels work in tiles of 4
rows (an AMD EPYC with repacked weights), 3 sequences' step cost what 4 did, so the first of
four to end saved next to nothing; priced at the slope, its long drafts made the
non-repetitive mix slower than plain decoding. A lone sequence's step there runs cheaper
kernels (12.5 ms against 27.2 ms for two), so the one ending just before the bound saves 15 ms
a token it keeps: the batch's last stretch runs at one sequence's cost.

A Conclave's candidates (`DraftSeq.voted`) are left out of all this: the vote may end the
Conclave at any candidate's end (an absolute majority of the first to finish, or a plurality
nothing left can change), so its slowest candidate does not bound it, and a token kept by any
of them is worth a plain token, as while requests wait. Held to the pace of one writing new
text, four candidates copying an invoice took 37-38 steps where 3-5 would do, and their
majority came only then.

The tokens a sequence may still generate bound its steps only if it runs to max_tokens; one
that stops at its end of text may finish first whatever it has left (a chat asking for 512
tokens and ending after 50). So the weights count in proportion to `binding`, how often recent
sequences ran to their limit (the controller keeps that count), and in proportion to the chance
that the batch's end is the end of its work: where each freed slot is taken again at once
(clients that send their next request as each answer comes, node/engine/refill.py), a token
kept by any sequence brings a request in sooner and is worth a plain token, as while one waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from node.engine.hooks import Draft, DraftAsk, DraftSeq


class Weighed(Protocol):
    """What the weights read and rewrite of one sequence's draft for the step (the planner's
    option): its positions' expected kept tokens in plain tokens' worth (`gains`), the seconds
    one of its rows costs, and the weights' own notes."""

    seq: DraftSeq
    draft: Draft
    gains: list[float]
    cost: float
    forced: int
    chances: list[float] | None  # each position's chance to be kept, once worked out
    least: float | None          # the least kept by the bound its gains were last weighed for


def draft_return(options: Sequence[Weighed], lengths: dict[int, int], n: int, row_s: float,
                 seconds: Callable[[int], float]) -> tuple[float, float]:
    """What the drafts in `lengths` buy and cost beside n decoding rows: (their expected kept
    tokens, in plain tokens' worth; the seconds they add to the step, rows on the cost curve and
    making beyond the rows)."""
    kept, rows, making = 0.0, 0, 0.0
    for o in options:
        j = lengths.get(o.seq.key, 0)
        kept += sum(o.gains[:j])
        rows += j
        making += (o.cost - row_s) * j
    return kept, seconds(n + rows) - seconds(n) + making


@dataclass(frozen=True, slots=True)
class Draining:
    """The worth of a kept token against a token of plain decoding: its row's share of the step,
    and for a sequence that bounds the batch its share of the step's fixed part too."""

    bound: frozenset[int]
    fixed_share: float   # the step's fixed part over the bounding sequences, per plain token
    row_share: float     # a row, per plain token
    spare: Mapping[int, float]  # by sequence not in the bound: what a later step sheds once it is done, per plain token
    ahead_share: float   # the same for a bounding sequence that gets ahead of the rest of the bound
    binding: float       # how far the tokens sequences have left predict when the batch's work ends
    kept_so_far: dict[int, float]  # the tokens a step each bounding sequence kept so far (its pace less one)
    headroom: float = float("inf")  # tokens the bound may keep before the next sequence bounds the batch
    lifted: frozenset[int] = frozenset()  # sequences in the bound at their past pace, out of it at their promise
    voted: frozenset[int] = frozenset()   # candidates of a vote: each kept token a plain token's worth

    @classmethod
    def of(cls, asks: Sequence[DraftAsk], draining: int | None, n: int, row_s: float, plain: float,
           paces: dict[int, float], binding: float, promised: dict[int, float] | None = None,
           shed: Callable[[int], float] | None = None) -> Draining | None:
        """The weights of a step of n decoding sequences (`plain`: plain decoding's tokens per
        second; `row_s`: a row's seconds; `paces`: each asking sequence's tokens a step so far;
        `promised`: the tokens a step its drafts promised when it last asked; `draining` as the
        scheduler tells it: None while requests wait, else the most tokens a decoding sequence
        that did not ask may still generate; `shed(m)`: what a step of m sequences costs less
        with one of them finished, None for a row). None while requests wait, or where a
        sequence does not say what it has left.

        A sequence's steps to go are what it has left at the faster of its pace so far and the
        pace its drafts promise: one that has just begun to draft a long match (its pace so far
        one token a step) is not taken to bound the batch for the rest of its tokens. Counted at
        its past pace alone, two of four requests started together that had not drafted yet
        became the bound, then the other two: the rows went to two sequences a step, in turn,
        and the batch took twice the steps."""
        if draining is None or not asks or any(ask.left <= 0 for ask in asks):
            return None
        voted = frozenset(ask.seq.key for ask in asks if ask.seq.voted)
        asks = [ask for ask in asks if ask.seq.key not in voted]
        promised = promised or {}
        togo = {ask.seq.key: ask.left / max(paces[ask.seq.key], promised.get(ask.seq.key, 0.0))
                for ask in asks if ask.seq.key in paces}
        if not togo:
            return None
        most = max(max(togo.values()), float(draining))
        bound = frozenset(key for key, steps in togo.items() if steps >= most - 1.0)
        past = {key: ask.left / paces[key] for ask in asks for key in [ask.seq.key] if key in paces}
        most_past = max(max(past.values()), float(draining))
        lifted = frozenset(key for key, steps in past.items() if steps >= most_past - 1.0) - bound
        runner_up = max([steps for key, steps in togo.items() if key not in bound] + [float(draining)])
        # in the tokens of the slowest bound one, at the pace its steps to go were counted at: at
        # its past pace alone, the batch's last step (nothing behind the bound) counted fewer
        # tokens than the bound had left, and four requests replaying their answers drafted 9
        # of the 13 that would have ended them, then took a step more for the last 4
        slowest = max(bound, key=togo.__getitem__, default=None)
        headroom = 0.0 if slowest is None else \
            (most - runner_up) * max(paces[slowest], promised.get(slowest, 0.0))
        per_token = 1.0 / plain  # a token of plain decoding: its share of the step
        fixed = max(0.0, n * per_token - n * row_s)
        others = max(0, n - len(togo))  # decoding without a pace here: at most `draining` tokens to go

        def share(m: int) -> float:
            return (row_s if shed is None else min(max(shed(m), 0.0), per_token)) / per_token

        spare = {key: share(1 + sum(1 for other, to in togo.items() if other != key and to >= steps)
                            + (others if draining >= steps else 0))
                 for key, steps in togo.items() if key not in bound}
        return cls(bound, fixed / max(1, len(bound)) / per_token, row_s / per_token, spare,
                   share(max(2, len(bound))), binding, {key: paces[key] - 1.0 for key in bound}, headroom, lifted,
                   voted)

    def worth(self, key: int, covered: float = 1.0) -> float:
        """A kept token of sequence `key`, where the rest of the bound gets as far with chance
        `covered`; of a vote's candidate, a plain token."""
        if key in self.voted:
            return 1.0
        if key not in self.bound:
            return self._counted(self.spare.get(key, self.row_share))
        return self._counted(self.row_share + self.fixed_share * covered)

    def worth_bound(self) -> float:
        """A kept token of a sequence that bounds the batch, the rest of the bound getting as far."""
        return self._counted(self.row_share + self.fixed_share)

    def _counted(self, share: float) -> float:
        """A kept token worth `share` of a plain token where sequences run to their limit, in
        proportion to how often they do (`binding`), and a plain token where they do not."""
        return 1.0 + self.binding * (share - 1.0)

    def together(self, options: Sequence[Weighed], drafted: dict[int, int]) -> bool:
        """Reweigh the drafts of bounding sequences by how far the rest of the bound moves too
        (`drafted`: the draft length each sequence got in the plan so far); whether any changed.

        The batch ends with its last sequence: where k sequences bound it alike (requests
        started together), it gets shorter by the fewest tokens any of them keeps. So of each
        one's expected kept tokens, those up to the least the bound keeps count their share of
        the step's fixed part, and those beyond it only their rows. What one of them keeps is
        the larger of its draft's expected kept tokens in this plan and what it kept a step so
        far: a sequence that drafts well but has no draft this step keeps pace over the run,
        while one that never drafts (prose, nothing to match) holds the others to their rows'
        worth. Sequences that draft alike weigh as in an open batch.

        Nor does the batch get shorter than the sequence next behind the bound (or one that does
        not draft) needs: kept tokens beyond that headroom count their rows alone, for a bound of
        one as for several."""
        if len(self.bound) < 2 and self.headroom == float("inf"):
            return False
        members = [o for o in options if o.seq.key in self.bound and o.gains]
        kept = {key: self.kept_so_far.get(key, 0.0) for key in self.bound}
        for o in members:
            chances = o.chances
            if chances is None:
                whole = self.worth(o.seq.key)
                chances = o.chances = [g / whole for g in o.gains]
            kept[o.seq.key] = max(kept[o.seq.key], sum(chances[:drafted.get(o.seq.key, 0)]))
        least = min(min(kept.values()) if len(self.bound) > 1 else float("inf"), self.headroom)
        if least == float("inf"):
            return False
        # a covered token shortens the batch (its row and a share of the fixed part); one beyond
        # the least gets its sequence ahead of the bound, so it sheds a row of a later step
        covered_worth, ahead_worth = self.worth_bound(), self._counted(self.ahead_share)
        changed = False
        for o in members:
            chances = o.chances or []
            if o.least == least or (o.least is None and least >= sum(chances)):
                o.least = least  # unchanged: every kept token of it is covered, as when it was made
                continue
            reached, gains = 0.0, []
            for p in chances:  # p: the chance the position is kept; the part of it the bound covers
                covered = min(max(least - reached, 0.0), p)
                gains.append(covered * covered_worth + (p - covered) * ahead_worth)
                reached += p
            o.gains, o.least, changed = gains, least, True
        return changed

    def level(self, options: Sequence[Weighed], drafts: dict[int, Draft], n: int, row_s: float,
              pays: Callable[[float, float], bool], rows_left: int,
              seconds: Callable[[int], float]) -> tuple[dict[int, Draft], int]:
        """The plan `drafts`, or one where every sequence of a tied bound drafts to the same
        length, if that gives the step more expected tokens a second (`seconds`: a step of so
        many rows; `pays(kept, extra seconds)`: whether drafts beat plain decoding). Ranking
        positions one by one cannot see that a draft which does not pay alone (the bound's
        weakest) is what lets the others' drafts shorten the batch. (drafts by sequence key,
        rows taken)."""
        members = [o for o in options if o.seq.key in self.bound]
        if len(self.bound) < 2 or not members or any(o.forced for o in options):
            return drafts, sum(len(d.tokens) for d in drafts.values())

        def rate(lengths: dict[int, int]) -> float:
            self.together(options, lengths)
            kept, extra = draft_return(options, lengths, n, row_s, seconds)
            return (n + kept) / (seconds(n) + extra) if pays(kept, extra) else 0.0

        now = {key: len(d.tokens) for key, d in drafts.items()}
        best, best_rate = now, max(rate(now), n / seconds(n))
        others = {key: j for key, j in now.items() if key not in self.bound}
        last, falling = 0.0, 0
        for length in range(1, max(len(o.gains) for o in members) + 1):
            lengths = {**others, **{o.seq.key: min(length, len(o.gains)) for o in members}}
            if sum(lengths.values()) > rows_left:
                break
            r = rate(lengths)
            if r > best_rate:
                best, best_rate = lengths, r
            falling = falling + 1 if r < last else 0
            if falling == 2:  # past the best length (a tile's edge may hold one length back)
                break
            last = r
        self.together(options, best)
        if best is now:
            return drafts, sum(now.values())
        by_key = {o.seq.key: o for o in options}
        return {key: by_key[key].draft.head(j) for key, j in best.items() if j}, sum(best.values())
