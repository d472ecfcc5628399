"""The official `openai` client against a live node on the real Gemma model."""

from __future__ import annotations

import openai
import pytest

from tests.node.api.live import LiveNode, node_settings

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    with LiveNode(node_settings(gemma_path, tmp_path_factory.mktemp("home"))) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)


MESSAGES = [{"role": "user", "content": "Name a color."}]


def test_models_list_and_retrieve(client, node):
    ids = [model.id for model in client.models.list().data]
    assert ids == [node.state.model.model_id] == ["gemma3-270m"]
    assert client.models.retrieve("gemma3-270m").id == "gemma3-270m"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_chat_completion_shape(client):
    reply = client.chat.completions.create(model="gemma3-270m", messages=MESSAGES, max_tokens=8, temperature=0)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "gemma3-270m" and reply.system_fingerprint.startswith("fp_")
    assert reply.created > 0
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_greedy_is_a_hit_the_second_time_with_true_usage(client):
    body = dict(model="gemma3-270m", messages=[{"role": "user", "content": "Count: one, two,"}],
                max_tokens=6, temperature=0)
    first = client.chat.completions.with_raw_response.create(**body)
    second = client.chat.completions.with_raw_response.create(**body)
    assert first.headers["X-Reame-Cache"] == "miss"
    assert second.headers["X-Reame-Cache"] == "hit"
    a, b = first.parse(), second.parse()
    assert a.choices[0].message.content == b.choices[0].message.content
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (b.usage.prompt_tokens, b.usage.completion_tokens)
    assert b.usage.completion_tokens > 1
    assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens  # an L1 answer computed nothing
    sampled = client.chat.completions.with_raw_response.create(**{**body, "temperature": 0.7})
    assert sampled.headers["X-Reame-Cache"] == "bypass"


def test_streamed_chat_matches_the_unstreamed_answer(client):
    body = dict(model="gemma3-270m", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
                temperature=0, seed=1)
    whole = client.chat.completions.create(**body).choices[0].message.content
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completions_with_prompt_forms_and_echo(client):
    reply = client.completions.create(model="gemma3-270m", prompt="The sky is", max_tokens=5, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].text
    batch = client.completions.create(model="gemma3-270m", prompt=["Red,", "One,"], max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    tokens = client.completions.create(model="gemma3-270m", prompt=[2, 818, 7217, 563], max_tokens=3, temperature=0)
    assert tokens.usage.prompt_tokens == 4
    echoed = client.completions.create(model="gemma3-270m", prompt="The sky is", max_tokens=5, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == "The sky is" + reply.choices[0].text


def test_streamed_completion(client):
    chunks = list(client.completions.create(model="gemma3-270m", prompt="1, 2, 3,", max_tokens=6,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_n_choices_share_a_prompt(client):
    reply = client.chat.completions.create(model="gemma3-270m", messages=MESSAGES, max_tokens=6, n=3,
                                           temperature=0.9, seed=7)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.message.content is not None for c in reply.choices)
    greedy = client.chat.completions.create(model="gemma3-270m", messages=MESSAGES, max_tokens=6, n=2,
                                            temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_stop_strings_end_the_text_before_them(client):
    free = client.completions.create(model="gemma3-270m", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = free.choices[0].text
    assert "," in text
    stop = text[text.index(","):][:1]
    stopped = client.completions.create(model="gemma3-270m", prompt="1, 2, 3, 4,", max_tokens=12,
                                        temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_logprobs_both_endpoints(client):
    chat = client.chat.completions.create(model="gemma3-270m", messages=MESSAGES, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        assert item.token == item.top_logprobs[0].token  # greedy picks the most likely
    text = client.completions.create(model="gemma3-270m", prompt="The sky is", max_tokens=4, temperature=0,
                                     logprobs=2)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == text.choices[0].text


def test_wrong_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert caught.value.code == "model_not_found"
