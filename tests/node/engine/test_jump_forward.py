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

import pytest

from node.engine.types import Finished, GenerationRequest, GrammarSpec, SamplingParams, TextDelta
from node.serving.structure import canonical_json
from tests.node.near_ties import NEAR_TIE

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
    return final, [lp for e in events[:-1] if isinstance(e, TextDelta) for lp in e.logprobs]


def test_forced_tokens_are_jumped_and_the_json_is_unchanged(engine):
    jumped = engine.stats()["jumped_tokens"]
    reference, logprobs = answer(engine, logprobs=1)  # every token from its own row
    assert engine.stats()["jumped_tokens"] == jumped
    final, _ = answer(engine, logprobs=None)
    n_jumped = engine.stats()["jumped_tokens"] - jumped
    assert n_jumped >= 8  # the keys and the punctuation between them (10 measured)
    a, b = reference.generated, final.generated
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        assert a == b
    else:
        gap = logprobs[first].top[0][2] - logprobs[first].top[1][2]
        assert gap < NEAR_TIE, f"diverged at token {first} with a clear margin {gap:.3f}"
    record = json.loads(engine.detokenize(b).decode())
    assert set(record) == set(SCHEMA["properties"])
