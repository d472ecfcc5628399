"""A request that fails while being admitted ends alone, on the real Gemma engine.

The failure is injected (a sampler that raises for one seed), the way any unexpected bug in
preparing one request would surface: the other requests decoding at the same moment must
finish normally, the failing one must get its own error (never hang), and every slot and KV
cell it took must come back.
"""

from __future__ import annotations

import pytest

from node.engine import sequence as sequence_module
from node.engine.errors import InvalidRequest
from node.engine.types import GenerationRequest, SamplingParams

POISON_SEED = 987_654_321


class ExplodingSampler(sequence_module.TokenSampler):
    def __init__(self, params, n_vocab, **kwargs):
        if kwargs.get("seed") == POISON_SEED:
            raise RuntimeError("injected admission failure")
        super().__init__(params, n_vocab, **kwargs)


def request(engine, text: str, seed: int | None = None, n: int = 24) -> GenerationRequest:
    return GenerationRequest(tuple(engine.tokenize(text)), max_tokens=n,
                             sampling=SamplingParams(temperature=0.8, seed=seed if seed is not None else 7))


def test_a_failure_while_admitting_one_request_ends_it_alone(engine, monkeypatch):
    monkeypatch.setattr(sequence_module, "TokenSampler", ExplodingSampler)
    steady = [engine.submit(request(engine, text)) for text in ("One, two, three,", "The capital of Italy is")]
    poisoned = engine.submit(request(engine, "Tell me a story", seed=POISON_SEED))
    late = engine.submit(request(engine, "def add(a, b):"))
    finished = {name: list(handle.iter_sync(timeout=120))[-1]
                for name, handle in (("a", steady[0]), ("b", steady[1]), ("poisoned", poisoned), ("late", late))}
    assert finished["poisoned"].reason == "error"
    assert "injected admission failure" in finished["poisoned"].error
    for name in ("a", "b", "late"):
        assert finished[name].reason in ("length", "stop"), (name, finished[name])
        assert finished[name].generated
    stats = engine.stats()
    assert stats["slots_free"] == stats["slots_total"] and stats["kv_cells_reserved"] == 0
    again = list(engine.submit(request(engine, "Once more:", n=4)).iter_sync(timeout=60))[-1]
    assert again.reason in ("length", "stop")


@pytest.mark.parametrize("change, words", [
    ({"seed": -5}, "seed"),
    ({"logit_bias": {10**9: 1.0}}, "logit_bias"),
    ({"repeat_penalty": 0.0}, "repeat_penalty"),
    ({"top_p": 0.0}, "top_p"),
])
def test_sampling_values_the_engine_cannot_run_are_refused_at_submit(engine, change, words):
    sampling = SamplingParams(temperature=0.8, **change)
    with pytest.raises(InvalidRequest, match=words):
        engine.submit(GenerationRequest(tuple(engine.tokenize("Hi")), max_tokens=4, sampling=sampling))
    assert engine.stats()["queued"] == 0
