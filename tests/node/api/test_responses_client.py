"""The official `openai` client's Responses API against a live node on the real Gemma model.

create (string and item input, instructions), stream (the helper and stream=True), retrieve,
delete, `previous_response_id` chains (also across two nodes sharing one ARCA), `store: false`,
`text.format` and forced function calls (Gemma's built-in template renders no tools, so calls
are the forced ones and `auto` is a clear 400), through the node's key.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.node.api.live import LiveNode, node_settings
from tests.node.api.test_anthropic_client import KEY, MODEL, node  # noqa: F401  (the same keyed live node)

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
COLOR = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
         "required": ["color"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_create_retrieve_delete(client):
    reply = client.responses.create(model=MODEL, input="Name a color.", instructions="Answer in one word.",
                                    max_output_tokens=8, temperature=0, top_p=0.9, metadata={"case": "one"})
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == MODEL
    assert reply.status in ("completed", "incomplete") and reply.output[0].type == "message"
    assert reply.output_text == reply.output[0].content[0].text and reply.output_text
    assert reply.usage.input_tokens > 5 and 0 < reply.usage.output_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.instructions == "Answer in one word." and reply.metadata == {"case": "one"}
    if reply.status == "incomplete":
        assert reply.incomplete_details.reason == "max_output_tokens"
    again = client.responses.retrieve(reply.id)
    assert again.id == reply.id and again.output_text == reply.output_text
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)


def test_a_repeated_greedy_request_is_an_l1_hit_stored_or_not(client):
    for store in (True, False):
        body = dict(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Count: 1, 2,"}]}],
                    max_output_tokens=6, temperature=0, store=store)
        first = client.responses.with_raw_response.create(**body)
        second = client.responses.with_raw_response.create(**body)
        assert second.headers["X-Reame-Cache"] == "hit", store
        a, b = first.parse(), second.parse()
        assert a.output_text == b.output_text and a.usage.output_tokens == b.usage.output_tokens
        assert b.usage.input_tokens_details.cached_tokens == b.usage.input_tokens  # computed nothing
    sampled = client.responses.with_raw_response.create(model=MODEL, input="Hi", max_output_tokens=4,
                                                        temperature=0.7)
    assert sampled.headers["X-Reame-Cache"] == "bypass"


def test_store_false_is_not_kept(client):
    reply = client.responses.create(model=MODEL, input="Hello", max_output_tokens=4, temperature=0, store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="And then?", previous_response_id=reply.id, max_output_tokens=4)
    assert caught.value.body["param"] == "previous_response_id"


def test_previous_response_id_continues_the_conversation(client, node):
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    # the chained prompt is the whole conversation: it is longer than the question alone by the first turn
    alone = client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=8, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    # the same conversation sent as items gives the same prompt
    items = [{"role": "user", "content": "My name is Ada."},
             {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
             {"role": "user", "content": "What is my name?"}]
    whole = client.responses.create(model=MODEL, input=items, max_output_tokens=8, temperature=0)
    assert whole.usage.input_tokens == second.usage.input_tokens and whole.output_text == second.output_text


def test_stream_events_and_the_stream_helper(client):
    body = dict(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    whole = client.responses.create(**body)
    events = list(client.responses.create(**body, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    item_ids = {event.item_id for event in events if hasattr(event, "item_id")}
    assert item_ids == {events[-1].response.output[0].id}
    with client.responses.stream(model=MODEL, input="Pick a color.", max_output_tokens=32, temperature=0,
                                 text={"format": {"type": "json_schema", "name": "color", "schema": COLOR}}) as stream:
        deltas = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == deltas
    jsonschema.validate(json.loads(deltas), COLOR)
    assert client.responses.retrieve(final.id).output_text == deltas  # a streamed response is stored too


def test_structured_output_through_text_format(client):
    reply = client.responses.create(model=MODEL, input="Pick a color.", max_output_tokens=32, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "color", "schema": COLOR,
                                                     "strict": True}})
    jsonschema.validate(json.loads(reply.output_text), COLOR)
    assert reply.text.format.type == "json_schema"
    anything = client.responses.create(model=MODEL, input="A JSON object, please.", max_output_tokens=32,
                                       temperature=0, text={"format": {"type": "json_object"}})
    if anything.status == "completed":  # the grammar closed the object (else max_output_tokens cut it)
        assert isinstance(json.loads(anything.output_text), dict)


def test_function_calls_and_their_outputs(client):
    reply = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=48,
                                    temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert reply.tool_choice.name == "get_weather" and reply.tools[0].name == "get_weather"
    # the result, by previous_response_id: the call is in the stored chain
    chained = client.responses.create(
        model=MODEL, previous_response_id=reply.id, max_output_tokens=12, temperature=0, tools=[WEATHER],
        tool_choice="none", input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C, clear"}])
    assert chained.output[0].type == "message" and chained.output_text
    # the same loop with every item sent back
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
              "arguments": calls[0].arguments},
             {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C, clear"}]
    whole = client.responses.create(model=MODEL, input=items, max_output_tokens=12, temperature=0, tools=[WEATHER],
                                    tool_choice="none")
    assert whole.output_text == chained.output_text and whole.usage.input_tokens == chained.usage.input_tokens
    streamed = list(client.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER],
                                            tool_choice="required", max_output_tokens=48, temperature=0, stream=True))
    kinds = [event.type for event in streamed]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = [event.item for event in streamed if event.type == "response.output_item.done"]
    assert done[-1].type == "function_call" and "city" in json.loads(done[-1].arguments)
    assert kinds[-1] == "response.completed"


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
    ({"input": "Hi", "tools": [WEATHER]}, "tools"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    # name, strict and schema beside type text are unused, but still held to their documented shape
    ({"input": "Hi", "text": {"format": {"type": "text", "strict": {"": None}}}}, "text.format.strict"),
    ({"input": "Hi", "text": {"format": {"type": "json_object", "name": 0.5}}}, "text.format.name"),
    ({"input": "Hi", "text": {"format": {"type": "text", "schema": "x"}}}, "text.format.schema"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "reasoning": {"effort": "low"}}, "reasoning"),
])
def test_clear_400s(client, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, **body)
    assert caught.value.body["param"] == param


def test_the_key_is_required(node):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{node.url}/v1", api_key="wrong", max_retries=0).responses.create(
            model=MODEL, input="Hi", max_output_tokens=2)


def test_a_chain_continues_on_another_node_of_the_fleet(gemma_path, tmp_path):
    """Two nodes on one ARCA: a response stored through node A is retrieved, continued and deleted
    through node B. (The two apps share one loaded engine to spare a second model load; each has
    its own archive client, store and HTTP server.)"""
    from node.assembly import open_engine
    from tests.arca.arca_harness import start_server

    arca = start_server(tmp_path)
    remote = {"arca.remote": f"127.0.0.1:{arca.port}"}
    settings_a = node_settings(gemma_path, tmp_path / "a", **remote)
    engine = open_engine(settings_a)
    try:
        with LiveNode(settings_a, engine=engine) as a, \
                LiveNode(node_settings(gemma_path, tmp_path / "b", **remote), engine=engine) as b:
            on_a = openai.OpenAI(base_url=f"{a.url}/v1", api_key="unused", max_retries=0, timeout=120)
            on_b = openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", max_retries=0, timeout=120)
            first = on_a.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=6, temperature=0)
            assert on_b.responses.retrieve(first.id).output_text == first.output_text
            second = on_b.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                           max_output_tokens=6, temperature=0)
            assert on_a.responses.retrieve(second.id).previous_response_id == first.id
            on_b.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                on_a.responses.retrieve(first.id)
    finally:
        engine.close()
        arca.stop()
