"""The service on the fake engine (tests/node/fake_engine.py): planning, L1, errors, sessions.

No model: these check the orchestration (what is looked up, what reaches the engine, what
is remembered, which typed error a failure becomes), which does not depend on what the
model answers. The real model's answers through the same service are in tests/node/api.
"""

from __future__ import annotations

import dataclasses

import pytest

from arca.archive import ArchiveConfig
from node.api.schemas import parse_chat, parse_completion
from node.archive.client import EmbeddedArchive
from node.engine import errors as engine_errors
from node.engine.types import GrammarSpec
from node.models.templates import ChatTemplate
from node.serving.errors import ContextLengthExceeded, GenerationFailed, InvalidRequest, Overloaded
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.plan import ChoiceDone, ChoiceText
from node.serving.service import CompletionService, ServiceOptions
from node.sessions.store import SessionStore
from tests.node.fake_engine import BOS, N_VOCAB, FakeEngine

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 64}


@pytest.fixture
async def service(tmp_path):
    engine = FakeEngine(tmp_path / "fake.gguf")
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=1 << 24))
    model = ServedModel(model_id="fake", names=frozenset({"fake"}), fingerprint="f" * 64, kv_type="f16",
                        template=ChatTemplate.builtin("gemma"), n_vocab=N_VOCAB, n_ctx=engine.n_ctx, bos_token=BOS)
    sessions = SessionStore.open(tmp_path / "sessions")
    service = CompletionService(engine, archive, model, Metrics(), ServiceOptions(observe=False), sessions=sessions)
    yield service
    await service.drain()
    await archive.close()


async def answer(service, plan):
    async with service.answer(plan) as result:
        events = [event async for event in result.events()]
    return result.cache, events


def as_computed(events):
    """The events with no prompt counted as cached: how an L1 replay, which reports its whole
    prompt as cached, compares with the answer that computed it."""
    return [dataclasses.replace(e, cached_tokens=0) if isinstance(e, ChoiceDone) else e for e in events]


def replayed(again, first) -> bool:
    """`again` is `first` replayed from L1: the same events, the whole prompt counted as cached."""
    done = [e for e in again if isinstance(e, ChoiceDone)]
    return as_computed(again) == first and done[0].cached_tokens > 0


def text_of(events, index=0):
    return "".join(e.text for e in events if isinstance(e, ChoiceText) and e.index == index)


async def test_a_greedy_answer_is_remembered_and_replayed_without_the_engine(service):
    plan = service.plan_chat(parse_chat(CHAT))
    cache, first = await answer(service, plan)
    await service.drain()
    assert cache == "miss" and text_of(first).startswith("Fake answer to")
    assert [e for e in first if isinstance(e, ChoiceDone)][0].finish_reason == "stop"
    cache, again = await answer(service, service.plan_chat(parse_chat(CHAT)))
    assert cache == "hit" and replayed(again, first) and len(service.engine.submitted) == 1


async def test_sampled_requests_bypass_l1(service):
    plan = service.plan_chat(parse_chat({**CHAT, "temperature": 0.7, "seed": 1}))
    assert plan.jobs[0].key is None
    for _ in range(2):
        assert (await answer(service, plan))[0] == "bypass"
    assert len(service.engine.submitted) == 2


async def test_a_grammar_is_part_of_the_key(service):
    plain = service.plan_chat(parse_chat(CHAT))
    options = plain.options
    constrained = dataclasses.replace(options, sampling=dataclasses.replace(options.sampling, grammar=GrammarSpec("gbnf", 'root ::= "a"')))
    job = service.planner.job(0, "chat", "t", plain.jobs[0].prompt_tokens, "", constrained, ())
    assert job.key != plain.jobs[0].key and job.request.sampling.grammar == GrammarSpec("gbnf", 'root ::= "a"')


@pytest.mark.parametrize("engine_error, expected, param", [
    (engine_errors.EngineOverloaded("full"), Overloaded, None),
    (engine_errors.EngineClosed("closed"), Overloaded, None),
    (engine_errors.InvalidRequest("the grammar does not parse"), InvalidRequest, None),
])
async def test_engine_errors_at_submit_become_serving_errors(service, engine_error, expected, param):
    service.engine.refuse = engine_error
    with pytest.raises(expected) as caught:
        await answer(service, service.plan_chat(parse_chat(CHAT)))
    assert caught.value.param == param


async def test_a_grammar_that_does_not_compile_is_refused_at_submit(service):
    plan = service.plan_chat(parse_chat(CHAT))
    job = plan.jobs[0]
    bad = dataclasses.replace(job, request=dataclasses.replace(
        job.request, sampling=dataclasses.replace(job.request.sampling, grammar=GrammarSpec("gbnf", "(unbalanced"))))
    with pytest.raises(InvalidRequest, match="grammar"):
        await answer(service, dataclasses.replace(plan, jobs=(bad,)))


async def test_too_long_names_max_tokens_when_a_smaller_one_would_fit(service):
    with pytest.raises(ContextLengthExceeded) as caught:
        await answer(service, service.plan_chat(parse_chat({**CHAT, "max_tokens": 4000})))
    assert caught.value.param == "max_tokens" and caught.value.code == "context_length_exceeded"


async def test_a_failed_generation_is_a_typed_error_and_not_remembered(service):
    service.engine.fail_after = 3
    with pytest.raises(GenerationFailed):
        await answer(service, service.plan_chat(parse_chat(CHAT)))
    await service.drain()
    service.engine.fail_after = None
    assert (await answer(service, service.plan_chat(parse_chat(CHAT))))[0] == "miss"


async def test_completions_with_n_and_echo(service):
    req = parse_completion({"prompt": ["ab", "cde"], "n": 2, "echo": True, "temperature": 0, "max_tokens": 5})
    plan = service.plan_completion(req)
    assert [job.first_choice for job in plan.jobs] == [0, 2]
    _, events = await answer(service, plan)
    assert text_of(events, 0) == "abFake " and text_of(events, 3) == "cdeFake "
    assert {e.index for e in events if isinstance(e, ChoiceDone) and e.finish_reason == "length"} == {0, 1, 2, 3}


async def test_token_ids_outside_the_vocabulary_are_refused(service):
    with pytest.raises(InvalidRequest) as caught:
        service.plan_completion(parse_completion({"prompt": [1, N_VOCAB + 5]}))
    assert caught.value.param == "prompt"


async def test_a_session_turn_continues_the_session_tokens(service):
    store = service.turns.store
    session = await store.create()
    first = service.plan_chat(parse_chat(CHAT), session=await store.get(session.id))
    await answer(service, first)
    after = await store.get(session.id)
    assert after.tokens[:len(first.jobs[0].prompt_tokens)] == first.jobs[0].prompt_tokens
    assert [m["role"] for m in after.messages] == ["user", "assistant"]
    second = service.plan_chat(parse_chat({**CHAT, "messages": [{"role": "user", "content": "More"}]}),
                               session=after)
    assert second.jobs[0].prompt_tokens[:len(after.tokens)] == after.tokens
    with pytest.raises(InvalidRequest):
        service.plan_chat(parse_chat({**CHAT, "n": 2}), session=after)
