"""Rejection sampling of draft-model tokens against the exact target distribution.

Table tests over an 8-token vocabulary, no model: for each shape of draft distribution q
(disjoint from p, one dominant token, near-uniform but tilted, close to p) and each sampling
setting (truncation, temperature, a grammar whose check admits a token its mask leaves out),
20,000 draws of `TokenSampler.choose_against` with a draft token drawn from q are compared
with the target distribution computed here from its definition (llama.cpp's chain: top_k,
top_p, min_p on the untempered row, then temperature; under a grammar, a draw from the row
kept when the check allows it, else a draw from the masked row) by a chi-square test. The
plain path (`choose`) is held to the same distribution, so both paths draw from one.

The two likeliest bugs of a rejection sampler are run on purpose (the residual drawn from p,
the accept ratio q/p): the same test must reject them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from node.engine import sampling
from node.engine.sampling import TokenSampler
from node.engine.types import SamplingParams

pytestmark = pytest.mark.slow  # 20,000 draws a case: make test runs them, make test-fast does not

V = 8
DRAWS = 20_000
LOGITS = np.array([2.0, 1.6, 1.2, 0.9, 0.5, 0.1, -0.4, -1.0], dtype=np.float32)


def dist(*weights: float) -> tuple[np.ndarray, np.ndarray]:
    w = np.array(weights, dtype=np.float64)
    ids = np.flatnonzero(w > 0)
    return ids, w[ids] / w[ids].sum()


SHAPES = {
    "disjoint": dist(0, 0, 0, 0, 0, 1, 2, 3),                 # q only where p is small or zero
    "dominant": dist(0.02, 0.02, 0.02, 0.02, 0.02, 0.86, 0.02, 0.02),  # one token p thinks unlikely
    "tilted": dist(1, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7),     # near-uniform, leaning the other way
    "close": dist(0.30, 0.22, 0.16, 0.12, 0.09, 0.06, 0.03, 0.02),  # a draft model that is nearly right
}


class Grammar:
    """Allows even tokens; its check also admits 3 (another spelling of what 2 says), which its
    mask leaves out, as llguidance's mask holds only the canonical token of forced bytes."""

    mask_ids = frozenset({0, 2, 4, 6})
    check_ids = mask_ids | {3}

    def allows(self, token: int) -> bool:
        return token in self.check_ids

    def masked(self, logits: np.ndarray) -> np.ndarray:
        out = np.full_like(logits, -np.inf)
        ids = sorted(self.mask_ids)
        out[ids] = logits[ids]
        return out

    def accept(self, token: int) -> None: ...

    def forced(self):
        return ()

    def valid(self, tokens) -> int:
        n = 0
        while n < len(tokens) and self.allows(tokens[n]):
            n += 1
        return n


def chain(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's chain written out plainly: the probability of each id."""
    order = sorted(range(V), key=lambda i: -logits[i])
    finite = [i for i in order if np.isfinite(logits[i])]
    keep = finite[:params.top_k] if params.top_k > 0 else finite
    base = np.exp(np.array([logits[i] for i in keep], dtype=np.float64) - logits[keep[0]])
    probs = base / (base.sum() if params.top_k > 0 else np.exp(
        np.array([logits[i] for i in finite], dtype=np.float64) - logits[keep[0]]).sum())
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        keep, probs = keep[:cut], probs[:cut]
    if params.min_p > 0.0:
        cut = max(1, int(np.count_nonzero(probs >= params.min_p * probs[0])))
        keep = keep[:cut]
    tempered = np.exp((np.array([logits[i] for i in keep], dtype=np.float64) - logits[keep[0]]) / params.temperature)
    out = np.zeros(V)
    out[keep] = tempered / tempered.sum()
    return out


def target(params: SamplingParams, grammar: Grammar | None) -> np.ndarray:
    row = chain(LOGITS, params)
    if grammar is None:
        return row
    allowed = np.array([grammar.allows(i) for i in range(V)])
    return np.where(allowed, row, 0.0) + row[~allowed].sum() * chain(grammar.masked(LOGITS), params)


def chi_square_rejects(counts: np.ndarray, p: np.ndarray, alpha_z: float = 3.72) -> bool:
    """True when the counts are not a sample of p (a token with p = 0 drawn, or the statistic
    above the chi-square quantile at z = 3.72, alpha 1e-4, by Wilson-Hilferty)."""
    if counts[p == 0].sum() > 0:
        return True
    live = p > 0
    expected = p[live] * counts.sum()
    statistic = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    if df < 1:
        return False
    quantile = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3
    return statistic > quantile


def draws_against(params: SamplingParams, q: tuple[np.ndarray, np.ndarray], grammar: Grammar | None,
                  n: int = DRAWS) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(12345)
    drafted = rng.choice(q[0], size=n, p=q[1])
    counts = np.zeros(V, dtype=np.int64)
    kept = 0
    for i in range(n):
        sampler = TokenSampler(params, V, seed=i, constraint=grammar)
        choice, was_kept = sampler.choose_against(LOGITS, [], int(drafted[i]), q)
        counts[choice.token] += 1
        kept += was_kept
    return counts, kept


def plain_draws(params: SamplingParams, grammar: Grammar | None, n: int = DRAWS) -> np.ndarray:
    counts = np.zeros(V, dtype=np.int64)
    for i in range(n):
        counts[TokenSampler(params, V, seed=i, constraint=grammar).choose(LOGITS, []).token] += 1
    return counts


PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
SETTINGS = {
    "plain": PLAIN,
    "top_k 3": SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0),
    "top_p 0.8": SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0),
    "min_p 0.2": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
    "cold": SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0),
    "hot top_k 5": SamplingParams(temperature=1.6, top_k=5, top_p=0.95, min_p=0.05),
}
CASES = [(shape, setting, False) for shape in SHAPES for setting in ("plain", "top_k 3", "cold")] + [
    ("dominant", "top_p 0.8", False), ("tilted", "min_p 0.2", False), ("close", "hot top_k 5", False),
    ("dominant", "plain", True), ("tilted", "top_k 3", True), ("close", "min_p 0.2", True),
    ("disjoint", "hot top_k 5", True),
]


@pytest.mark.parametrize(("shape", "setting", "with_grammar"), CASES)
def test_rejection_sampling_draws_the_target_distribution(shape, setting, with_grammar):
    params, grammar = SETTINGS[setting], Grammar() if with_grammar else None
    p = target(params, grammar)
    counts, kept = draws_against(params, SHAPES[shape], grammar)
    assert not chi_square_rejects(counts, p), (counts / DRAWS, p)
    q = np.zeros(V)
    q[SHAPES[shape][0]] = SHAPES[shape][1]
    expected_kept = float(np.minimum(p, q).sum())  # P(keep) of speculative sampling: sum min(p, q)
    assert abs(kept / DRAWS - expected_kept) < 4 * math.sqrt(expected_kept * (1 - expected_kept) / DRAWS) + 1e-9


@pytest.mark.parametrize("setting", ["plain", "top_k 3", "min_p 0.2"])
def test_the_plain_constrained_draw_has_the_same_distribution(setting):
    params, grammar = SETTINGS[setting], Grammar()
    assert not chi_square_rejects(plain_draws(params, grammar), target(params, grammar))


def test_top_k_2_with_the_top_token_forbidden_is_one_distribution_with_and_without_a_draft_model():
    """The case a simulation found: P(token 0) was 0.657 plain and 0.520 with a draft model."""

    class ForbidTop(Grammar):
        mask_ids = frozenset(range(1, V))
        check_ids = mask_ids

    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    grammar = ForbidTop()
    p = target(params, grammar)
    plain = plain_draws(params, grammar, 10_000)
    against, _ = draws_against(params, SHAPES["tilted"], grammar, 10_000)
    assert not chi_square_rejects(plain, p) and not chi_square_rejects(against, p)


def test_a_grammar_too_wide_to_check_falls_back_to_the_plain_draw(monkeypatch):
    monkeypatch.setattr(sampling, "CHECK_LIMIT", 0)  # the check may not be asked about the one extra token
    params, grammar = PLAIN, Grammar()
    assert TokenSampler(params, V, seed=1, constraint=grammar).target(LOGITS) is None
    counts, kept = draws_against(params, SHAPES["close"], grammar, 10_000)
    assert not chi_square_rejects(counts, target(params, grammar))


MUTATIONS = {
    "residual drawn from p": ("residual", lambda p, q: p),
    "accept ratio q/p": ("accept_draft", lambda u, p, q: p > 0.0 and u * p < q),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_table_catches_each_likely_bug(mutation, monkeypatch):
    """Each mutation must fail the same chi-square check on the shapes that expose it."""
    name, wrong = MUTATIONS[mutation]
    monkeypatch.setattr(sampling, name, wrong)
    caught = []
    for shape, setting in (("dominant", "plain"), ("tilted", "top_k 3"), ("dominant", "cold")):
        params = SETTINGS[setting]
        counts, _ = draws_against(params, SHAPES[shape], None)
        caught.append(chi_square_rejects(counts, target(params, None)))
    assert all(caught), caught


def test_a_seeded_draw_depends_on_its_position_only():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    walk = TokenSampler(params, V, seed=9)
    history: list[int] = []
    for _ in range(12):
        history.append(walk.choose(LOGITS, history).token)
    jump = TokenSampler(params, V, seed=9)
    assert jump.choose(LOGITS, history[:7]).token == history[7]  # no draws before it, the same token
    u = [sampling.uniform(9, position, sampling.DRAW) for position in range(2000)]
    assert 0.45 < float(np.mean(u)) < 0.55 and len(set(u)) == 2000
