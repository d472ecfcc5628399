"""The Conclave and best_of through the service, on the fake engine (tests/node/fake_engine.py).

The fake answers each candidate by its request (its seed tells the candidates apart), so the
orchestration is checked without a model: which candidates start and when, which are stopped,
what is answered and remembered, which field a bad request names. The real model's forks,
early stop and KV accounting are in tests/node/engine/test_engine_conclave.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from arca.archive import ArchiveConfig
from node.api.schemas import parse_chat, parse_completion
from node.archive.client import EmbeddedArchive
from node.models.templates import ChatTemplate
from node.serving.conclave.runner import ConclavePolicy
from node.serving.errors import InvalidRequest
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.plan import ChoiceDone, ChoiceText
from node.serving.service import CompletionService, ServiceOptions
from node.sessions.store import SessionStore
from tests.node.fake_engine import BOS, N_VOCAB, FakeEngine
from tests.node.serving.test_service import answer, replayed, text_of

CHAT = {"messages": [{"role": "user", "content": "What is 12 + 30?"}], "temperature": 0, "max_tokens": 64}


def make_service(tmp_path, policy: ConclavePolicy = ConclavePolicy()) -> CompletionService:
    engine = FakeEngine(tmp_path / "fake.gguf")
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=1 << 24))
    model = ServedModel(model_id="fake", names=frozenset({"fake"}), fingerprint="f" * 64, kv_type="f16",
                        template=ChatTemplate.builtin("gemma"), n_vocab=N_VOCAB, n_ctx=engine.n_ctx, bos_token=BOS)
    return CompletionService(engine, archive, model, Metrics(), ServiceOptions(observe=False, conclave=policy),
                             sessions=SessionStore.open(tmp_path / "sessions"))


@pytest.fixture
async def service(tmp_path):
    service = make_service(tmp_path)
    yield service
    await service.drain()
    await service.archive.close()


def by_seed(table: dict[int | None, str]):
    return lambda request: table[request.sampling.seed]


def done_of(events, index=0) -> ChoiceDone:
    return next(e for e in events if isinstance(e, ChoiceDone) and e.index == index)


async def test_candidate_zero_is_the_request_unchanged_and_explorers_sample_seeded(service):
    service.engine.answers = lambda request: "42"
    plan = service.plan_chat(parse_chat({**CHAT, "conclave": 5}))
    await answer(service, plan)
    first = service.engine.groups[0]
    assert first[0] == dataclasses.replace(plan.jobs[0].request, voted=True)  # greedy stays greedy
    assert all(r.voted for r in first)  # the planner knows the vote may end them early
    assert [r.sampling.seed for r in first[1:]] == [1, 2]
    assert all(r.sampling.temperature == 0.7 and r.prompt_tokens == first[0].prompt_tokens for r in first[1:])


async def test_first_candidates_agreeing_never_start_the_rest(service):
    service.engine.answers = lambda request: "The answer is 42."
    cache, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    assert [len(group) for group in service.engine.groups] == [3]  # an absolute majority of 5 started
    assert text_of(events) == "The answer is 42."
    assert done_of(events).consensus == {"consensus": 3, "candidates": 5, "votes": {"42": 3}, "stopped_early": True,
                                         "decision": "majority", "started": 3, "generated_tokens": 54}
    assert cache == "miss"


async def test_disagreement_starts_the_rest_in_the_same_group(service):
    service.engine.answers = by_seed({None: "It is 42", 1: "It is 41", 2: "It is 41", 3: "It is 42", 4: "It is 42"})
    _, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    assert [len(group) for group in service.engine.groups] == [3, 2]
    assert text_of(events) == "It is 42"
    verdict = done_of(events).consensus
    assert verdict["consensus"] == 3 and verdict["votes"] == {"42": 3, "41": 2}
    assert verdict["decision"] == "majority" and verdict["started"] == 5


async def test_a_majority_stops_the_others_mid_generation(tmp_path):
    service = make_service(tmp_path, ConclavePolicy(adaptive=False))
    long = "and so on " * 20
    service.engine.answers = by_seed({None: "7", 1: "7", 2: "7", 3: long, 4: long})
    _, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    assert text_of(events) == "7" and done_of(events).consensus["stopped_early"] is True
    metrics = service.metrics.render().decode()
    assert 'reame_conclave_candidates_total{outcome="cancelled"} 2.0' in metrics
    assert 'reame_conclave_candidates_total{outcome="finished"} 3.0' in metrics
    generated = 'reame_generated_tokens_total '
    tokens = float(next(line for line in metrics.splitlines() if line.startswith(generated))[len(generated):])
    assert tokens < 3 * 2 + 2 * len(long)  # the long ones were stopped before their end
    await service.archive.close()


async def test_a_plurality_the_last_cannot_change_stops_it(tmp_path):
    """7 from candidates 0 and 1, 8 and 9 from 2 and 3: whatever the last one answers, 7 wins
    (its 7 makes a majority, its 8 or 9 a tie that candidate 0's answer wins), so it is stopped."""
    service = make_service(tmp_path, ConclavePolicy(adaptive=False))
    long = "and so on " * 20
    service.engine.answers = by_seed({None: "7", 1: "7", 2: "8", 3: "9", 4: long})
    _, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    verdict = done_of(events).consensus
    assert text_of(events) == "7" and verdict["decision"] == "plurality" and verdict["stopped_early"] is True
    assert verdict["votes"] == {"7": 2, "8": 1, "9": 1}
    metrics = service.metrics.render().decode()
    assert 'reame_conclave_candidates_total{outcome="cancelled"} 1.0' in metrics
    await service.archive.close()


async def test_no_majority_plurality_then_medoid(service):
    service.engine.answers = by_seed({None: "1", 1: "2", 2: "2", 3: "3", 4: "4"})
    _, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    assert text_of(events) == "2" and done_of(events).consensus["decision"] == "plurality"
    service.engine.answers = by_seed({None: "the red fox runs far away", 1: "a red fox runs away", 2: "blue sky"})
    _, events = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 3, "temperature": 0.5})))
    assert done_of(events).consensus["decision"] == "medoid"
    assert text_of(events) in ("the red fox runs far away", "a red fox runs away")


async def test_a_stream_shows_only_the_winner(service):
    service.engine.answers = by_seed({None: "It is 41", 1: "It is 42", 2: "It is 42"})
    plan = service.plan_chat(parse_chat({**CHAT, "conclave": 3, "stream": True}))
    _, events = await answer(service, plan)
    assert {e.index for e in events} == {0}
    assert text_of(events) == "It is 42"


async def test_a_deterministic_conclave_is_cached_whole_and_keyed(service):
    service.engine.answers = lambda request: "42"
    body = {**CHAT, "conclave": 3}
    cache, first = await answer(service, service.plan_chat(parse_chat(body)))
    await service.drain()
    submitted = len(service.engine.submitted)
    cache_again, again = await answer(service, service.plan_chat(parse_chat(body)))
    assert (cache, cache_again) == ("miss", "hit") and len(service.engine.submitted) == submitted
    assert replayed(again, first) and done_of(again).consensus["consensus"] == 2
    keys = {service.plan_chat(parse_chat({**CHAT, **extra})).jobs[0].key
            for extra in ({}, {"conclave": 3}, {"conclave": 5}, {"conclave": 3, "seed": 9})}
    assert len(keys) == 4  # plain, N, and the explorers' seed all shape the answer


async def test_the_l1_key_of_a_conclave_covers_the_node_settings_that_shape_it(tmp_path):
    """Which candidates run (adaptive start) changes the verdict: votes, `started`, even the winner."""
    policies = (ConclavePolicy(), ConclavePolicy(explore_temperature=0.9), ConclavePolicy(seed=5),
                ConclavePolicy(adaptive=False), ConclavePolicy(initial=3))
    conclave, plain = set(), set()
    for i, policy in enumerate(policies):
        (tmp_path / str(i)).mkdir()
        service = make_service(tmp_path / str(i), policy)
        conclave.add(service.plan_chat(parse_chat({**CHAT, "conclave": 5})).jobs[0].key)
        plain.add(service.plan_chat(parse_chat(CHAT)).jobs[0].key)
        await service.archive.close()
    assert len(conclave) == len(policies)
    assert len(plain) == 1  # a plain request does not depend on them


async def test_best_of_returns_the_n_with_the_highest_mean_logprob(service):
    service.engine.answers = by_seed({10: "alpha", 11: "beta", 12: "gamma", 13: "delta"})
    service.engine.logprob = lambda request: {10: -2.0, 11: -0.1, 12: -1.0, 13: -0.2}[request.sampling.seed]
    body = {"prompt": "Hi", "max_tokens": 8, "temperature": 0.8, "seed": 10, "best_of": 4, "n": 2}
    _, events = await answer(service, service.plan_completion(parse_completion(body)))
    assert (text_of(events, 0), text_of(events, 1)) == ("beta", "delta")
    assert all(e.logprobs == () for e in events if isinstance(e, ChoiceText))  # not asked for: dropped
    assert all(r.logprobs == 0 for r in service.engine.groups[0])             # but computed for the choice
    _, events = await answer(service, service.plan_completion(parse_completion({**body, "logprobs": 1})))
    assert all(e.logprobs for e in events if isinstance(e, ChoiceText))


@pytest.mark.parametrize("body, param", [
    ({**CHAT, "conclave": 0}, "conclave"),
    ({**CHAT, "conclave": 17}, "conclave"),
    ({**CHAT, "conclave": 3, "n": 2}, "conclave"),
    ({**CHAT, "conclave": 3, "best_of": 3}, "conclave"),
    ({**CHAT, "best_of": 2, "n": 3}, "best_of"),
    ({**CHAT, "conclave": "3"}, "conclave"),
])
def test_bad_fields_name_themselves(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat(body)
    assert caught.value.param == param


async def test_node_limits_name_their_field(tmp_path):
    service = make_service(tmp_path, ConclavePolicy(max_candidates=4))
    with pytest.raises(InvalidRequest) as caught:
        service.plan_chat(parse_chat({**CHAT, "conclave": 5}))
    assert caught.value.param == "conclave" and "max_candidates" in caught.value.message
    with pytest.raises(InvalidRequest) as caught:
        service.plan_completion(parse_completion({"prompt": ["a", "b"], "conclave": 3}))
    assert caught.value.param == "prompt"
    assert service.turns is not None
    session = await service.turns.store.create()
    with pytest.raises(InvalidRequest) as caught:
        service.plan_chat(parse_chat({**CHAT, "conclave": 3}), session=session)
    assert caught.value.param == "conclave"
    await service.archive.close()


async def test_the_ledger_counts_a_generated_conclave_and_best_of(service):
    """What /v1/reame/stats reports: a Conclave's and a best_of's answer, generated on the fake
    engine (not replayed from L1), is served once each with the tokens the client received (the
    winner, the n chosen), while every candidate's tokens count as generated."""
    ledger = service.ledger
    service.engine.answers = lambda request: "The answer is 42."
    plan = service.plan_chat(parse_chat({**CHAT, "conclave": 5}))
    cache, events = await answer(service, plan)
    assert cache == "miss" and done_of(events).consensus["generated_tokens"] == 3 * 18
    assert (ledger.answers, ledger.l1_answers) == (1, 0)
    assert ledger.prompt_tokens == len(plan.jobs[0].prompt_tokens)
    assert ledger.completion_tokens == done_of(events).completion_tokens == 18
    await service.drain()
    cache, _ = await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5})))
    assert cache == "hit" and (ledger.answers, ledger.l1_answers) == (2, 1)  # the replay counted as before

    service.engine.answers = by_seed({10: "alpha", 11: "beta", 12: "gamma", 13: "delta"})
    service.engine.logprob = lambda request: {10: -2.0, 11: -0.1, 12: -1.0, 13: -0.2}[request.sampling.seed]
    body = {"prompt": "Hi", "max_tokens": 8, "temperature": 0.8, "seed": 10, "best_of": 4, "n": 2}
    plan = service.plan_completion(parse_completion(body))
    before = ledger.completion_tokens
    _, events = await answer(service, plan)
    assert (ledger.answers, ledger.l1_answers) == (3, 1)
    assert ledger.completion_tokens - before == len("beta") + len("delta") + 2  # each with its end of generation
    assert ledger.completion_tokens - before == sum(e.completion_tokens for e in events if isinstance(e, ChoiceDone))
