"""The Conclave and best_of over HTTP on the real Gemma model, through the official `openai`
client (the extension field in `extra_body`) and next to other users in the batch."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from tests.node.api.live import LiveNode, http_json, node_settings, settled

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "What is 2 + 2? Answer with a number."}]


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    with LiveNode(node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{"server.parallel": 6})) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=180)


def test_chat_conclave_through_the_openai_client(client, node):
    reply = client.chat.completions.create(model="gemma3-270m", messages=QUESTION, max_tokens=6, temperature=0,
                                           extra_body={"conclave": 3})
    assert len(reply.choices) == 1 and reply.choices[0].finish_reason in ("stop", "length")
    verdict = reply.model_extra["reame"]
    assert verdict["candidates"] == 3 and 1 <= verdict["consensus"] <= 3
    assert set(verdict) >= {"consensus", "candidates", "votes", "stopped_early"}
    assert isinstance(verdict["stopped_early"], bool)
    again = client.chat.completions.with_raw_response.create(
        model="gemma3-270m", messages=QUESTION, max_tokens=6, temperature=0, extra_body={"conclave": 3})
    assert again.headers["X-Reame-Cache"] == "hit"  # a deterministic Conclave is cached whole
    assert again.parse().model_extra["reame"] == verdict
    assert again.parse().choices[0].message.content == reply.choices[0].message.content
    stats = settled(node)
    assert stats["kv_cells_reserved"] == 0 and stats["slots_free"] == stats["slots_total"]


def test_a_streamed_conclave_sends_only_the_winner(client):
    chunks = list(client.chat.completions.create(model="gemma3-270m", messages=QUESTION, max_tokens=6,
                                                 temperature=0.8, seed=4, stream=True, extra_body={"conclave": 3}))
    assert {choice.index for chunk in chunks for choice in chunk.choices} == {0}
    last = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason][-1]
    assert last.model_extra["reame"]["candidates"] == 3


def test_openai_best_of_on_completions(client):
    reply = client.completions.create(model="gemma3-270m", prompt="The capital of France is", max_tokens=5,
                                      temperature=0.9, seed=7, best_of=3, n=2)
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert all(choice.logprobs is None for choice in reply.choices)  # not asked for


def test_bad_fields_are_400s_naming_them(client, node):
    for extra, param in (({"conclave": 17}, "conclave"), ({"conclave": 0}, "conclave"),
                         ({"conclave": 3, "n": 2}, "conclave")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="gemma3-270m", messages=QUESTION, max_tokens=4,
                                           extra_body=extra)
        assert caught.value.body["param"] == param
    status, _, body = http_json("POST", node.url + "/v1/completions",
                                {"prompt": "Hi", "max_tokens": 4, "best_of": 2, "n": 3})
    assert status == 400 and body["error"]["param"] == "best_of"


def test_a_conclave_next_to_three_plain_users(client, node):
    prompts = ["One, two, three,", "The sky is", "Roses are red,"]

    def plain(prompt):
        return client.completions.create(model="gemma3-270m", prompt=prompt, max_tokens=8, temperature=0,
                                         extra_body={"speculation": True}).choices[0].text

    def conclave():
        return client.chat.completions.create(model="gemma3-270m", messages=QUESTION, max_tokens=6,
                                              temperature=0.7, seed=11, extra_body={"conclave": 3})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        voted = pool.submit(conclave)
        users = [pool.submit(plain, prompt) for prompt in prompts]
        texts = [user.result(timeout=300) for user in users]
        reply = voted.result(timeout=300)
    assert all(texts) and reply.model_extra["reame"]["candidates"] == 3
    stats = settled(node)
    assert stats["active"] == 0 and stats["kv_cells_reserved"] == 0
