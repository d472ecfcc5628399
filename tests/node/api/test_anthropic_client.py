"""Anthropic's `anthropic` client against a live node on the real Gemma model, through the key.

The node requires an API key; the client sends it as `x-api-key` (its own header) or, with
`auth_token`, as a Bearer. This client version has no sampling parameters of its own, so
temperature, top_p and top_k travel in `extra_body` (as its users send them). Gemma's built-in template renders no tools, so tool calls here are
the forced ones (tool_choice `any` / `tool`, under the call grammar), and `auto` is a clear 400;
tool results sent back are rendered as chat's tool results are.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings

pytestmark = pytest.mark.model

KEY = "sesame"
GREEDY = {"temperature": 0}
MODEL = "gemma3-270m"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "description": "The time in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{"server.api_key": KEY})
    with LiveNode(settings) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return anthropic.Anthropic(base_url=node.url, api_key=KEY, max_retries=0, timeout=120)


def test_create_through_either_header_and_the_l1(node, client):
    body = dict(model=MODEL, max_tokens=8, extra_body=GREEDY, system="You answer briefly.",
                messages=[{"role": "user", "content": "Name a color."}], metadata={"user_id": "u1"})
    first = client.messages.with_raw_response.create(**body)
    bearer = anthropic.Anthropic(base_url=node.url, auth_token=KEY, max_retries=0, timeout=120)
    second = bearer.messages.with_raw_response.create(**body)
    assert first.headers["X-Reame-Cache"] == "miss" and second.headers["X-Reame-Cache"] == "hit"
    a, b = first.parse(), second.parse()
    assert a.type == "message" and a.role == "assistant" and a.id.startswith("msg_") and a.model == MODEL
    assert a.content[0].type == "text" and a.content[0].text == b.content[0].text
    assert a.stop_reason in ("end_turn", "max_tokens") and 0 < a.usage.output_tokens <= 8
    assert a.usage.input_tokens > 5 and b.usage.input_tokens == 0  # an L1 answer computed no prompt token
    assert b.usage.cache_read_input_tokens == a.usage.input_tokens + a.usage.cache_read_input_tokens
    labels = {"route": "/v1/messages", "status": "200"}
    assert metric(node.url, "reame_requests_total", headers={"Authorization": f"Bearer {KEY}"},
                  **labels) >= 2


def test_system_blocks_and_text_blocks_render_like_strings(client):
    plain = client.messages.count_tokens(model=MODEL, system="Be brief.",
                                         messages=[{"role": "user", "content": "Hi there"}])
    blocks = client.messages.count_tokens(
        model=MODEL, system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}])
    assert plain.input_tokens == blocks.input_tokens > 5
    reply = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Hi there"}])
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == client.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Hi there"}]).input_tokens


def test_max_tokens_and_stop_sequences_give_their_stop_reasons(client):
    messages = [{"role": "user", "content": "Count from one to twenty: one, two, three,"}]
    cut = client.messages.create(model=MODEL, max_tokens=3, extra_body=GREEDY, messages=messages)
    assert cut.stop_reason == "max_tokens" and cut.stop_sequence is None and cut.usage.output_tokens == 3
    long = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=messages)
    text = long.content[0].text
    words = [w for w in text.replace(",", " ").split() if w.isalpha()]
    assert len(words) >= 2, text
    # The answer's second word: the stopped answer ends before it. Two greedy runs may part at a
    # near-tie further on (tests/node/near_ties.py), and the stopped one drafts from this answer.
    stop = words[1]
    stopped = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=messages,
                                     stop_sequences=[stop, "never-said"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert text.startswith(stopped.content[0].text) and stop not in stopped.content[0].text
    again = client.messages.with_raw_response.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=messages,
                                                     stop_sequences=[stop, "never-said"])
    assert again.headers["X-Reame-Cache"] == "hit"  # the L1 answer remembers which stop ended it
    assert again.parse().stop_reason == "stop_sequence" and again.parse().stop_sequence == stop


def test_sampling_fields_are_accepted(client):
    reply = client.messages.create(model=MODEL, max_tokens=4, extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20},
                                   messages=[{"role": "user", "content": "Hello"}],
                                   extra_headers={"anthropic-version": "2023-06-01"})
    assert reply.content[0].type == "text" and reply.usage.output_tokens >= 1


def test_structured_output_through_output_config(client):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    reply = client.messages.create(model=MODEL, max_tokens=32, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Pick a color."}],
                                   output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(reply.content[0].text), schema)
    assert reply.stop_reason == "end_turn"


def test_stream_helper_and_raw_events(client):
    body = dict(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=[{"role": "user", "content": "Say hello."}])
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # the stream is the L1 hit of the first (greedy) answer: it computed none of the prompt
    assert final.usage.input_tokens == 0
    assert final.usage.cache_read_input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    sampled = {**body, "extra_body": {"temperature": 0.5, "seed": 3}}
    events = [event.type for event in client.messages.create(**sampled, stream=True)]
    assert events[:2] == ["message_start", "content_block_start"] and "content_block_delta" in events
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_the_event_sequence_on_the_wire(node):
    """The client hides pings: the raw stream shows Anthropic's whole sequence, named events only."""
    import urllib.request

    import orjson

    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Say hello."}]}
    request = urllib.request.Request(f"{node.url}/v1/messages", data=orjson.dumps(body), method="POST",
                                     headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        frames = response.read().decode().strip().split("\n\n")
    names = [frame.split("\n")[0].removeprefix("event: ") for frame in frames]
    datas = [orjson.loads(frame.split("\n")[1].removeprefix("data: ")) for frame in frames]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in zip(names, datas))
    assert datas[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens") and datas[-2]["usage"]["output_tokens"]


def test_forced_tool_use_streamed_and_not_and_the_result_sent_back(client):
    asked = {"role": "user", "content": "What is the weather in Paris?"}
    reply = client.messages.create(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[asked],
                                   tools=[WEATHER, TIME], tool_choice={"type": "tool", "name": "get_weather"})
    assert reply.stop_reason == "tool_use"
    use = [block for block in reply.content if block.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather"
    jsonschema.validate(use[0].input, WEATHER["input_schema"])
    with client.messages.stream(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[asked], tools=[WEATHER],
                                tool_choice={"type": "any"}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
    assert final.content[-1].name == "get_weather" and isinstance(final.content[-1].input, dict)
    assert "input_json" in kinds  # the helper's event for input_json_delta
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                           "content": json.dumps({"temperature": 18, "sky": "clear"})}]}
    answer = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY,
                                    messages=[asked, {"role": "assistant", "content": reply.content}, result],
                                    tools=[WEATHER, TIME], tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    counted = client.messages.count_tokens(model=MODEL, messages=[asked, {"role": "assistant",
                                                                           "content": reply.content}, result])
    assert counted.input_tokens > 20


def test_max_tokens_is_required(node):
    status, _, body = http_json("POST", f"{node.url}/v1/messages",
                                {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}, {"x-api-key": KEY})
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'max_tokens' is required" in body["error"]["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
     "tool_use_id"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}, "auto"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER],
      "tool_choice": {"type": "tool", "name": "missing"}}, "tool_choice.name"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "extra_body": {"temperature": "hot"}},
     "temperature"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "stop_sequences": [""]}, "stop_sequences"),
])
def test_clear_400s_in_anthropics_envelope(client, body, fragment):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{"model": MODEL, **body})
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"
    assert fragment in caught.value.body["error"]["message"]


def test_auth_not_found_and_unknown_model_errors(node):
    bad = anthropic.Anthropic(base_url=node.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.body["error"]["type"] == "authentication_error"
    status, _, body = http_json("POST", f"{node.url}/v1/messages/nowhere", {}, {"x-api-key": KEY})
    assert status == 404 and body == {"type": "error", "error": {"type": "not_found_error",
                                                                 "message": "Unknown path: POST /v1/messages/nowhere"}}
    good = anthropic.Anthropic(base_url=node.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as missing:
        good.messages.create(model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    # x-api-key is the Messages routes' header: elsewhere the Bearer is the key
    status, _, body = http_json("GET", f"{node.url}/v1/models", None, {"x-api-key": KEY})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_overloaded_is_anthropics_overloaded_error(node, client):
    gate = node.state.gate
    taken = 0
    while gate.try_enter():  # a full gate, as under load
        taken += 1
    try:
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
        assert caught.value.status_code == 503 and caught.value.body["error"]["type"] == "overloaded_error"
    finally:
        for _ in range(taken):
            gate.leave()
