"""Jump-forward on the real Gemma model: tokens the grammar admits alone are taken without
their logits, and the constrained output is the one decoding every token from its own row
gives.

The reference is the same engine on a path that never jumps: a request asking for logprobs
needs every token's row, so each token, forced or not, is chosen from its logits under the
mask (node/engine/scheduler.py `_jump`). Greedy JSON under an 8-field schema must come out
the same text, up to near-ties (tests/node/near_ties.py: the steps differ in shape), and
the jumped tokens must be counted.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from node.engine.types import Finished, GenerationRequest, GrammarSpec, SamplingParams
from node.serving.structure import canonical_json
from tests.node.near_ties import NEAR_TIE, first_parting, reference_of

pytestmark = [pytest.mark.model]

DOCUMENT = ("New starter record. Maria Keane joined Dunmore Supplies Ltd on 3 March 2025 as senior accounts clerk "
            "in the finance department. She is 41 years old and can be reached at maria.keane@dunmore.example or "
            "on 01632 960 118. Her manager is Tom Harlow.")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "employer": {"type": "string"},
                   "job_title": {"type": "string"}, "department": {"type": "string"}, "email": {"type": "string"},
                   "phone": {"type": "string"}, "manager": {"type": "string"}},
    "required": ["name", "age", "employer", "job_title", "department", "email", "phone", "manager"],
    "additionalProperties": False,
}
PROMPT = f"Document:\n{DOCUMENT}\n\nThe person in the document as a JSON record:\n"


def answer(engine, logprobs: int | None):
    spec = GrammarSpec("json_schema", canonical_json(SCHEMA))
    req = GenerationRequest(tuple(engine.tokenize(PROMPT)), max_tokens=160, logprobs=logprobs,
                            sampling=SamplingParams(temperature=0.0, grammar=spec))
    events = list(engine.submit(req).iter_sync(timeout=600))
    final = events[-1]
    assert isinstance(final, Finished) and final.reason == "stop", final.error
    return reference_of(events)


def test_forced_tokens_are_jumped_and_the_json_is_unchanged(engine):
    jumped = engine.stats()["jumped_tokens"]
    reference, logprobs = answer(engine, logprobs=1)  # every token from its own row
    assert engine.stats()["jumped_tokens"] == jumped
    final, _ = answer(engine, logprobs=None)
    n_jumped = engine.stats()["jumped_tokens"] - jumped
    assert n_jumped >= 8  # the keys and the punctuation between them (10 measured)
    a, b = reference.generated, final.generated
    first = first_parting(a, b)
    if first is None:
        assert a == b
    else:
        gap = logprobs[first].top[0][2] - logprobs[first].top[1][2]
        assert gap < NEAR_TIE, f"diverged at token {first} with a clear margin {gap:.3f}"
    record = json.loads(engine.detokenize(b).decode())
    assert set(record) == set(SCHEMA["properties"])


def test_forced_rows_and_non_final_prompt_rows_ask_for_no_logits(engine):
    """Each token the engine did not jump came from exactly one logits row (no drafts here: the
    test engine has no speculator): forced tokens and every prompt row but the last cost the
    transformer body only. Asking logits for them would add a row per forced token."""
    before = engine.stats()
    final, _ = answer(engine, logprobs=None)
    after = engine.stats()
    jumped = after["jumped_tokens"] - before["jumped_tokens"]
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert jumped >= 8
    assert after["logit_rows"] - before["logit_rows"] == generated - jumped
    # a prompt of several chunks (the test engine's step budget is 64 tokens): one row, its last
    long_prompt = tuple(engine.tokenize(PROMPT * 3))
    assert len(long_prompt) > 128
    before = engine.stats()
    list(engine.submit(GenerationRequest(long_prompt, max_tokens=1,
                                         sampling=SamplingParams(temperature=0.0))).iter_sync(timeout=600))
    assert engine.stats()["logit_rows"] - before["logit_rows"] == 1


def test_where_bytes_are_forced_the_canonical_token_is_chosen_whatever_the_row(engine):
    """At the start the schema forces `{"name":"`; a token spelling only a prefix of it (`{`)
    passes the grammar's check, so a row preferring it would have chosen it and the choice
    would hang on the logits. The sampler takes the forced (canonical) token instead, which is
    what lets the engine take it without its row."""
    from node.engine.sampling import TokenSampler

    spec = GrammarSpec("json_schema", canonical_json(SCHEMA))
    matcher = engine.prepare_grammar(spec).matcher()
    forced = list(matcher.forced())
    assert forced, "the schema forces its first key"
    (brace,) = engine.tokenize("{", add_bos=False, special=False)
    assert brace != forced[0] and matcher.allows(brace)
    row = np.zeros(engine.model_info.n_vocab, dtype=np.float32)
    row[brace] = 30.0
    for temperature in (0.0, 0.8):
        m = engine.prepare_grammar(spec).matcher()
        sampler = TokenSampler(SamplingParams(temperature=temperature), engine.model_info.n_vocab, seed=7,
                               constraint=m)
        assert sampler.choose(row, []).token == forced[0]
        assert matcher.only() == forced[0]


def test_a_complete_answer_ends_by_jumping(engine):
    """Once the JSON is complete only end-of-generation tokens fit: `only` names one, so the
    engine ends the sequence without decoding the closing token for a row."""
    final, _ = answer(engine, logprobs=1)
    matcher = engine.prepare_grammar(GrammarSpec("json_schema", canonical_json(SCHEMA))).matcher()
    for token in final.generated:
        assert matcher.only() in (None, token)
        matcher.accept(token)
    assert matcher.only() in engine.model_info.eog_tokens
