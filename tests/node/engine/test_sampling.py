"""Table tests for the numpy sampler: llama.cpp semantics on small hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from node.engine.errors import InvalidRequest
from node.engine.sampling import TokenSampler, apply_penalties, candidates, group_maxima, top_ids
from node.engine.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def row(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


@pytest.mark.parametrize(
    ("logits", "bias", "expected"),
    [
        ((0.1, 3.0, 2.0), {}, 1),
        ((0.1, 3.0, 2.0), {1: -5.0}, 2),
        ((0.1, 3.0, 2.0), {1: float("-inf"), 2: float("-inf")}, 0),
        ((0.1, 3.0, 2.0), {0: 10.0}, 0),
    ],
)
def test_greedy_argmax_after_logit_bias(logits, bias, expected):
    sampler = TokenSampler(SamplingParams(temperature=0.0, logit_bias=bias), len(logits))
    source = row(*logits)
    before = source.copy()
    assert sampler.choose(source, []).token == expected
    np.testing.assert_array_equal(source, before)  # the logits buffer is never written


@pytest.mark.parametrize(
    ("params", "window", "expected"),
    [
        # positive logits are divided, negative multiplied (llama.cpp repeat penalty)
        (SamplingParams(repeat_penalty=2.0), [0, 1], (2.0, -4.0, 1.0)),
        # a token counted twice pays frequency twice and presence once
        (SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), [0, 0, 2], (2.75, -2.0, 0.25)),
        (SamplingParams(repeat_penalty=1.5, presence_penalty=1.0), [2], (4.0, -2.0, -1.0 / 3)),
    ],
)
def test_penalties_follow_llama_cpp(params, window, expected):
    logits = row(4.0, -2.0, 1.0)
    apply_penalties(logits, window, params)
    np.testing.assert_allclose(logits, expected, rtol=1e-6)


def test_penalty_window_is_last_n_of_history():
    params = SamplingParams(temperature=0.0, repeat_penalty=100.0, repeat_last_n=2)
    sampler = TokenSampler(params, 3)
    # token 0 is best but only outside the window: it stays the choice
    assert sampler.choose(row(5.0, 4.9, 1.0), [0, 1, 1]).token == 0
    # inside the window it is penalised below token 2
    assert sampler.choose(row(5.0, 4.9, 1.0), [1, 0]).token == 2


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (SamplingParams(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0), {3}),
        (SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0), {3, 2}),
        # probabilities ~ (0.64, 0.24, 0.09, 0.03) for ids (3, 2, 1, 0): top_p 0.7 keeps two
        (SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0), {3, 2}),
        # min_p 0.3 of the best keeps ids with p >= 0.19
        (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3), {3, 2}),
        (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), {0, 1, 2, 3}),
    ],
)
def test_truncation_bounds_what_can_be_drawn(params, allowed):
    sampler = TokenSampler(params, 4, seed=7)
    logits = row(0.0, 1.0, 2.0, 3.0)
    drawn = {sampler.choose(logits, [0] * i).token for i in range(400)}  # a position each
    assert drawn == allowed


def test_temperature_sharpens_and_flattens():
    logits = row(0.0, 1.0)
    def share_of_best(t: float) -> float:
        sampler = TokenSampler(SamplingParams(temperature=t, top_k=0, top_p=1.0, min_p=0.0), 2, seed=3)
        return sum(sampler.choose(logits, [0] * i).token for i in range(4000)) / 4000
    cold, warm, hot = share_of_best(0.25), share_of_best(1.0), share_of_best(4.0)
    assert cold > warm > hot > 0.5
    assert abs(warm - 1 / (1 + np.exp(-1.0))) < 0.03


def test_same_seed_same_draws_and_different_seeds_differ():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    logits = np.zeros(1000, dtype=np.float32)
    first = [TokenSampler(params, 1000).choose(logits, []).token for _ in range(1)]
    a = TokenSampler(params, 1000)
    b = TokenSampler(params, 1000)
    c = TokenSampler(params, 1000, seed=43)
    run_a = [a.choose(logits, [0] * i).token for i in range(20)]
    assert run_a == [b.choose(logits, [0] * i).token for i in range(20)]
    assert run_a != [c.choose(logits, [0] * i).token for i in range(20)]
    assert first[0] == run_a[0]


@pytest.mark.parametrize("truncation", [dict(top_k=40, top_p=0.95, min_p=0.05), dict(top_k=0, top_p=0.9, min_p=0.0),
                                        dict(top_k=0, top_p=1.0, min_p=0.05)])
def test_a_seeded_draw_survives_a_near_tie_flipping_in_the_last_bits(truncation):
    """Two tokens near a tie swap ranks when a row moves by a few ulps (a verify row computed in
    a batch of another shape): the seeded draw of a position must stay what it was, except where
    two scores lie within that move. Drawn best first, every draw on either token flipped."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0.0, 1.0, 2000).astype(np.float32)
    logits[[17, 900]] = 4.0, 4.0 + 1e-5  # the two likeliest, nearly tied
    moved = logits.copy()
    moved[[17, 900]] = 4.0 + 1e-5, 4.0
    params = SamplingParams(temperature=0.8, seed=7, **truncation)
    sampler = TokenSampler(params, len(logits))
    draws = [(sampler.choose(logits, [0] * i).token, sampler.choose(moved, [0] * i).token) for i in range(800)]
    on_the_pair = sum(a in (17, 900) for a, _ in draws)
    assert on_the_pair > 30  # the pair holds a good share of the mass (6-28% here, by truncation)
    assert sum(a != b for a, b in draws) <= 1


@pytest.mark.parametrize("k", [1, 5, 40, 300, 5000])
def test_top_ids_are_exactly_the_k_largest(k):
    rng = np.random.default_rng(k)
    logits = rng.normal(0, 3, 262_144).astype(np.float32)
    logits[rng.integers(0, 262_144, 50)] += 15.0  # a few clear favourites, as real logits have
    expected = np.sort(logits)[::-1][:k]
    ids = top_ids(logits, k)
    assert len(ids) == k == len(set(ids.tolist()))
    np.testing.assert_array_equal(logits[ids], expected)


def test_top_p_pool_without_top_k_is_normalised_over_the_whole_vocabulary():
    logits = np.zeros(4096, dtype=np.float32)
    logits[:2] = 10.0  # two tokens hold ~0.99 of the mass
    ids, probs = candidates(logits, 0, 0.95)
    assert set(ids[:2].tolist()) == {0, 1}
    assert probs[:2].sum() == pytest.approx(2 * np.exp(10) / (2 * np.exp(10) + 4094), rel=1e-5)
    ids, probs = candidates(logits, 0, 0.9999)  # needs more than the first pool
    assert probs.sum() >= 0.9999


def test_logprobs_of_chosen_and_top():
    params = SamplingParams(temperature=0.0)
    sampler = TokenSampler(params, 3, logprobs=2)
    choice = sampler.choose(row(np.log(0.5), np.log(0.3), np.log(0.2)), [])
    assert choice.token == 0
    assert choice.logprob == pytest.approx(np.log(0.5), abs=1e-5)
    assert [t for t, _ in choice.top] == [0, 1]
    assert choice.top[1][1] == pytest.approx(np.log(0.3), abs=1e-5)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(logit_bias={10: 1.0}),
        SamplingParams(logit_bias={-1: 1.0}),
        SamplingParams(logit_bias={1: float("nan")}),
        SamplingParams(temperature=-1.0),
        SamplingParams(top_p=0.0),
        SamplingParams(min_p=1.5),
        SamplingParams(repeat_penalty=0.0),
        SamplingParams(top_k=-3),
    ],
)
def test_bad_parameters_are_refused(params):
    with pytest.raises(InvalidRequest):
        TokenSampler(params, 10)


class OnlyEven:
    """A constraint admitting even token ids only, counting whole-vocabulary masks."""

    def __init__(self) -> None:
        self.masks = 0
        self.accepted: list[int] = []

    def allows(self, token: int) -> bool:
        return token % 2 == 0

    def masked(self, logits):
        self.masks += 1
        out = np.full_like(logits, -np.inf)
        out[::2] = logits[::2]
        return out

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def forced(self):
        return []

    def valid(self, tokens) -> int:
        return 0


def test_constrained_sampling_checks_first_and_masks_only_on_rejection():
    from node.engine.sampling import TokenSampler
    from node.engine.types import SamplingParams

    row = np.zeros(64, dtype=np.float32)
    row[10], row[13] = 5.0, 9.0
    constraint = OnlyEven()
    sampler = TokenSampler(SamplingParams(temperature=0.0), 64, constraint=constraint)
    assert sampler.choose(row, []).token == 10 and constraint.masks == 1  # 13 rejected: masked, best even
    row[12] = 20.0
    assert sampler.choose(row, []).token == 12 and constraint.masks == 1  # allowed as sampled: no mask
    assert constraint.accepted == [10, 12]
    sampled = TokenSampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1), 64,
                           constraint=OnlyEven())
    assert all(sampled.choose(row, [0] * i).token % 2 == 0 for i in range(200))
    with_logprobs = TokenSampler(SamplingParams(temperature=0.0), 64, logprobs=2, constraint=OnlyEven())
    choice = with_logprobs.choose(row, [])
    assert choice.token == 12 and all(token % 2 == 0 for token, _ in choice.top)


class CanonicalMask(OnlyEven):
    """Like llguidance where the grammar forces bytes: the check admits token 13 (another
    spelling of them), the mask holds only the canonical token 12."""

    def allows(self, token: int) -> bool:
        return token in (12, 13)

    def masked(self, logits):
        self.masks += 1
        out = np.full_like(logits, -np.inf)
        out[12] = logits[12]
        return out


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_asking_for_logprobs_never_changes_the_constrained_choice(temperature):
    from node.engine.sampling import TokenSampler
    from node.engine.types import SamplingParams

    rng = np.random.default_rng(3)
    rows = [rng.normal(0, 1, 64).astype(np.float32) for _ in range(50)]
    for row in rows:
        row[13], row[12] = 6.0, 5.0  # the check's spelling wins before any mask
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    plain = TokenSampler(params, 64, constraint=CanonicalMask())
    reported = TokenSampler(params, 64, logprobs=2, constraint=CanonicalMask())
    choices = [(plain.choose(row, []), reported.choose(row, [])) for row in rows]
    assert [a.token for a, _ in choices] == [b.token for _, b in choices]
    assert {a.token for a, _ in choices} <= {12, 13}
    for _, choice in choices:  # the reported numbers cover the chosen token and what the mask allows
        assert choice.logprob is not None and np.isfinite(choice.logprob)
        assert {token for token, _ in choice.top} <= {12, 13}


def test_top_ids_is_exact_over_a_large_vocabulary_with_ties():
    """The strided groups' bound (top_ids) finds exactly the k largest logits, ties included."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        row = (rng.standard_normal(262144) * rng.uniform(0.5, 4.0)).astype(np.float32)
        if trial % 3 == 0:
            row[rng.integers(0, len(row), 50)] = 9.0  # many equal best logits
        k = int(rng.integers(1, 1000))
        got = top_ids(row, k)
        assert len(set(got.tolist())) == k and np.array_equal(row[got], np.sort(row)[::-1][:k])


def test_a_greedy_choice_keeps_a_draft_token_only_at_a_near_tie():
    from node.engine.sampling import DRAFT_TIE_NATS

    row = np.zeros(64, dtype=np.float32)
    row[20], row[21], row[22] = 9.0, 9.0 - DRAFT_TIE_NATS / 2, 9.0 - 2 * DRAFT_TIE_NATS
    greedy = TokenSampler(SamplingParams(temperature=0.0), 64)
    assert greedy.choose(row, []).token == 20
    assert greedy.choose(row, [], 21).token == 21  # within the bound: the draft's token stands
    assert greedy.choose(row, [], 22).token == 20  # a clear margin: the argmax, as plain decoding
    assert greedy.choose(row, [], 20).token == 20
    biased = TokenSampler(SamplingParams(temperature=0.0, logit_bias={21: -1.0}), 64)
    assert biased.choose(row, [], 21).token == 20  # judged on the adjusted row
    constrained = TokenSampler(SamplingParams(temperature=0.0), 64, constraint=OnlyEven())
    row[23] = 9.0 - DRAFT_TIE_NATS / 2
    assert constrained.choose(row, [], 23).token == 20  # a token the grammar forbids is never kept
    seeded = TokenSampler(SamplingParams(temperature=1.0, top_k=1, seed=3), 64)
    assert seeded.choose(row, [], 21).token == 21  # top_k 1 seeded: the draft raised is the one left
    assert seeded.choose(row, [], 22).token == 20
    unseeded = TokenSampler(SamplingParams(temperature=1.0, top_k=1), 64, seed=3)
    assert unseeded.choose(row, [], 21).token == 20  # unseeded sampling draws as it would without a draft


def test_a_seeded_draw_keeps_a_draft_token_only_where_its_draw_was_a_near_edge():
    """Two tokens: token 1's score (tempered logit plus its noise) just beats token 0's. A
    seeded draw keeps a draft of token 0 only where raising its logit by DRAFT_TIE_NATS would
    have drawn it; an unseeded draw never keeps a token it did not draw."""
    from node.engine.sampling import DRAFT_TIE_NATS, DRAW, gumbel

    seed, temperature = 11, 0.8
    noise = gumbel(seed, 0, DRAW, np.array([0, 1]))

    def row_short_by(nats: float) -> np.ndarray:  # token 0's logit that far below a tie of scores
        row = np.full(8, -1e9, dtype=np.float32)
        row[0], row[1] = temperature * (noise[1] - noise[0]) - nats, 0.0
        return row

    for short, kept in ((DRAFT_TIE_NATS * 0.5, 0), (DRAFT_TIE_NATS * 1.5, 1)):
        seeded = TokenSampler(SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed), 8)
        assert seeded.choose(row_short_by(short), []).token == 1  # plain draw: token 1
        assert seeded.choose(row_short_by(short), [], 0).token == kept
        assert seeded.choose(row_short_by(short), [], 1).token == 1
    unseeded = TokenSampler(SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0), 8, seed=seed)
    assert unseeded.choose(row_short_by(DRAFT_TIE_NATS * 0.5), [], 0).token == 1


def test_a_seeded_draw_holds_a_draft_token_on_the_edge_of_min_p():
    """A token a hair inside min_p's edge in one row is a hair outside it in a row of another
    step's shape. A seeded draw keeps a draft of it there, and a rival let in by such a hair
    does not displace a draft; a clear margin either way draws as plain decoding does."""
    from node.engine.sampling import DRAW, gumbel

    seed, t, min_p = 5, 0.8, 0.05
    edge = float(np.log(min_p))  # logits this far below the best survive min_p

    def sampler() -> TokenSampler:
        return TokenSampler(SamplingParams(temperature=t, top_k=0, top_p=1.0, min_p=min_p, seed=seed), 8)

    def row(**at: float) -> np.ndarray:
        values = np.full(8, -1e9, dtype=np.float32)
        values[0] = 0.0
        for name, logit in at.items():
            values[int(name[1:])] = logit
        return values

    def position_where(wins) -> int:
        return next(p for p in range(5000) if wins(gumbel(seed, p, DRAW, np.arange(3))))

    # The draft cut: token 1 drawn just inside the edge, the row then moving it just outside.
    p = position_where(lambda g: (edge + 0.05) / t + g[1] > g[0] + 0.1)
    history = [0] * p
    assert sampler().choose(row(t1=edge + 0.05), history).token == 1
    assert sampler().choose(row(t1=edge - 0.05), history).token == 0          # plain: cut
    assert sampler().choose(row(t1=edge - 0.05), history, 1).token == 1       # the draft stands
    assert sampler().choose(row(t1=edge - 0.3), history, 1).token == 0        # cut by a margin

    # A rival let in: token 2 outside the edge, then just inside, drawing best there.
    p = position_where(lambda g: (edge + 0.05) / t + g[2] > -1.0 / t + g[1] + 0.2 and -1.0 / t + g[1] > g[0])
    history = [0] * p
    assert sampler().choose(row(t1=-1.0, t2=edge - 0.05), history).token == 1
    assert sampler().choose(row(t1=-1.0, t2=edge + 0.05), history).token == 2  # plain: the rival
    assert sampler().choose(row(t1=-1.0, t2=edge + 0.05), history, 1).token == 1
    assert sampler().choose(row(t1=-1.0, t2=edge + 0.3), history, 1).token == 2  # well inside: it draws


def test_a_seeded_draw_holds_its_token_when_many_shares_move_a_little():
    """A verify row computed in a step of another shape moves many logits by a tenth of a nat at
    once (docs/BENCHMARKS.md, seeded sampled repeat). A seeded draw replayed on such a row, with
    its earlier token as the draft, must keep that token unless two scores were that close:
    here under 1.5% of positions part (a draw walking the cumulative shares parted at 13%, and
    one judging the draft without the edge of top_p and min_p at 2.5%)."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0.0, 1.5, 2000).astype(np.float32)
    logits[rng.integers(0, 2000, 12)] += 4.0
    sampler = TokenSampler(SamplingParams(temperature=0.8, seed=7, top_k=40, top_p=0.95, min_p=0.05), len(logits))
    parted = 0
    for position in range(600):
        moved = logits + rng.normal(0, 0.05, len(logits)).astype(np.float32)
        before = sampler.choose(logits, [0] * position).token
        parted += sampler.choose(moved, [0] * position, before).token != before
    assert parted < 9


def test_the_row_after_a_draft_keeps_the_sources_next_token_at_a_near_tie():
    """verify(): the bonus row (no draft token of its own) is chosen with the token the source
    expects there (`after`) as its draft token: kept at a near-tie, never counted as kept."""
    from node.engine.sampling import DRAFT_TIE_NATS
    from node.engine.verify import verify

    rows = np.zeros((2, 64), dtype=np.float32)
    rows[0, 7] = 9.0                                               # the draft token 7 is the argmax
    rows[1, 30], rows[1, 31] = 9.0, 9.0 - DRAFT_TIE_NATS / 2      # the bonus row: 31 a near-tie of 30
    greedy = TokenSampler(SamplingParams(temperature=0.0), 64)

    def run(after):
        out: list[int] = []
        verdict = verify([5, 7], rows, lambda row, draft: greedy.choose(row, out, draft),
                         lambda choice: out.append(choice.token), after=after)
        return out, verdict.accepted, verdict.n_valid

    assert run(None) == ([7, 30], 1, 2)
    assert run(31) == ([7, 31], 1, 2)   # the hint stands at the near-tie; it is no kept draft token
    rows[1, 31] = 9.0 - 2 * DRAFT_TIE_NATS
    assert run(31) == ([7, 30], 1, 2)   # a clear margin: the argmax, as plain decoding


class Refusing(OnlyEven):
    """A grammar that fails on accept, as one does on a token it cannot take."""

    def accept(self, token: int) -> None:
        raise InvalidRequest("refused")


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, logit_bias={3: 4.0, 7: float("-inf")}, repeat_penalty=1.3),
    SamplingParams(temperature=0.8, seed=5, logit_bias={3: 4.0}, frequency_penalty=0.7, presence_penalty=0.2,
                   repeat_last_n=-1),
])
def test_bias_and_penalties_applied_in_place_choose_as_on_a_copy_and_leave_the_row_as_it_was(params):
    """Bias and penalties go into the logits buffer itself and are put back after the choice:
    every choice (plain, against a draft distribution, with logprobs) equals the one made on a
    read-only copy of the row (where they work on a copy), and the buffer is bit for bit as
    before, also when the choice fails."""
    rng = np.random.default_rng(7)
    for i in range(50):
        source = rng.normal(0.0, 2.0, 64).astype(np.float32)
        before = source.copy()
        frozen = source.copy()
        frozen.flags.writeable = False
        history = [int(t) for t in rng.integers(0, 64, 20)]
        a, b = (TokenSampler(params, 64, logprobs=3) for _ in range(2))
        assert a.choose(source, history) == b.choose(frozen, history)
        dist = (np.array([3, 5, 9]), np.array([0.5, 0.3, 0.2]))
        assert a.choose_against(source, history, 5, dist) == b.choose_against(frozen, history, 5, dist)
        if not params.greedy:  # a draft model's distribution is a sampled request's
            assert a.draft_distribution(source, history)[0].tolist() == b.draft_distribution(frozen, history)[0].tolist()
        assert a.coupled_draw(source, history) == b.coupled_draw(frozen, history)
        with pytest.raises(InvalidRequest):
            TokenSampler(params, 64, constraint=Refusing()).choose(source, history)
        np.testing.assert_array_equal(source, before)


@pytest.mark.parametrize("shape", [(64, 4096), (2, 7), (1, 5), (6, 4), (32, 3)])
def test_group_maxima_are_the_column_maxima(shape):
    """The halving gives numpy's reduction's numbers for every shape (powers of two by halving,
    others by the reduction), and leaves the row as it was."""
    rng = np.random.default_rng(shape[0])
    view = rng.normal(0, 3, shape).astype(np.float32)
    view[0, 0] = -np.inf
    before = view.copy()
    np.testing.assert_array_equal(group_maxima(view), np.maximum.reduce(view, axis=0))
    np.testing.assert_array_equal(view, before)
