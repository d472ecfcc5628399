"""The embeddings' L1 key and record, normalisation with `dimensions`, and how the savings count
them (node/serving/embeddings.py, ledger.py, savings.py): table tests, no model."""

from __future__ import annotations

import numpy as np
import pytest

from node.serving.embeddings import (
    KEY_PREFIX, decode_vector, embedding_key, encode_vector, normalised,
)
from node.serving.l1 import KEY_PREFIX as COMPLETION_PREFIX
from node.serving.ledger import Ledger
from node.serving.savings import Savings


def test_keys_are_apart_from_completions_and_shaped_by_model_pooling_and_tokens():
    key = embedding_key("f" * 64, "mean", (2, 10, 11))
    assert key.startswith(KEY_PREFIX) and not key.startswith(COMPLETION_PREFIX)
    assert key == embedding_key("f" * 64, "mean", [2, 10, 11])
    others = {embedding_key("e" * 64, "mean", (2, 10, 11)), embedding_key("f" * 64, "last", (2, 10, 11)),
              embedding_key("f" * 64, "mean", (2, 10)), embedding_key("f" * 64, "mean", (2, 11, 10))}
    assert key not in others and len(others) == 4


def test_the_record_round_trips_and_a_damaged_one_is_a_miss():
    vector = np.linspace(-1, 1, 640, dtype=np.float32)
    record = encode_vector(vector)
    assert np.array_equal(decode_vector(record, 640), vector)
    flipped = bytearray(record)
    flipped[-1] ^= 1
    for bad in (bytes(flipped), record[:-4], b"XXXX" + record[4:], record[:10], b""):
        assert decode_vector(bad, 640) is None
    assert decode_vector(record, 320) is None  # another width: never served as this model's


@pytest.mark.parametrize("dimensions", [None, 1, 64, 640])
def test_rows_are_cut_then_unit_length(dimensions):
    rows = np.random.default_rng(1).normal(size=(3, 640)).astype(np.float32)
    rows[2] = 0
    out = normalised(rows, dimensions)
    width = dimensions or 640
    assert out.shape == (3, width) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out[:2], axis=1), 1.0, atol=1e-6)
    assert np.allclose(out[0], rows[0, :width] / np.linalg.norm(rows[0, :width]), atol=1e-6)
    assert not out[2].any()  # a zero row stays zero, never NaN


def test_savings_count_embedded_tokens_served_cached_and_computed():
    ledger = Ledger()
    engine = {"prefill_tokens": 0, "generated_tokens": 0, "draft_accepted": 0, "embedding_tokens": 0}
    savings = Savings(ledger, lambda: dict(engine))
    ledger.embedded(30, 10, all_cached=False)  # 20 tokens decoded, 10 answered from L1
    engine["embedding_tokens"] += 20
    ledger.embedded(10, 10, all_cached=True)
    period = savings.report()["since_start"]
    assert period["tokens_served"] == 40 and period["prompt_tokens"] == 40 and period["answers"] == 2
    assert period["tokens_computed"] == 20
    assert period["saved"]["l1"] == {"tokens": 20, "share": 0.5, "answers": 1}
