"""The Messages and Responses APIs on the fake engine with a template that renders tools.

The real Gemma model's template renders no tools and the base model cannot be made to write a
call on demand, so the calls chosen by the model (`tool_choice` auto) and failures in the middle
of a stream are checked here on the fake engine (tests/node/fake_engine.py): the real app on a
loopback socket, a scripted answer holding a `<tool_call>` block, and a GGUF-style template
with tool support (as Qwen's marks calls), through the stock `anthropic` and `openai` clients.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request

import anthropic
import openai
import orjson
import pytest

from tests.node.api.test_http_fake import node  # noqa: F401  (a live node on this module's `fake`)
from tests.node.fake_engine import FakeEngine

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool | tojson }}{% endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for call in m.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALLING = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    engine = FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")
    engine._info = dataclasses.replace(engine.model_info, chat_template=TEMPLATE)
    return engine


@pytest.fixture(autouse=True)
def script(fake):
    fake.answers = lambda request: CALLING
    yield
    fake.answers = None
    fake.fail_after = None


@pytest.fixture(scope="module")
def claude(node):
    return anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def oai(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=30)


TOOL = {"name": "get_weather", "description": "The weather", "input_schema": WEATHER}
ASKED = [{"role": "user", "content": "Weather in Paris?"}]


def test_messages_auto_tool_use_whole_and_streamed(claude, fake):
    reply = claude.messages.create(model="fake", max_tokens=200, messages=ASKED, tools=[TOOL])
    assert [block.type for block in reply.content] == ["text", "tool_use"]
    assert reply.content[0].text == "Let me check." and reply.stop_reason == "tool_use"
    assert reply.content[1].name == "get_weather" and reply.content[1].input == {"city": "Paris"}
    assert "get_weather" in bytes(t for t in fake.submitted[-1].prompt_tokens if t < 256).decode()  # rendered
    with claude.messages.stream(model="fake", max_tokens=200, messages=ASKED, tools=[TOOL],
                                tool_choice={"type": "auto"}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[1].input == {"city": "Paris"} and final.content[1].id == final.content[1].id
    assert "input_json" in kinds and "text" in kinds
    # the call and its result sent back, then a text answer
    fake.answers = lambda request: "It is sunny."
    answer = claude.messages.create(model="fake", max_tokens=200, tools=[TOOL], messages=[
        *ASKED, {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[1].id, "content": "18 C"}]}])
    assert answer.content[0].text == "It is sunny." and answer.stop_reason == "end_turn"
    prompt = bytes(t for t in fake.submitted[-1].prompt_tokens if t < 256).decode()
    assert '<tool_call>{"name": "get_weather"' in prompt and "<|im_start|>tool\n18 C" in prompt


def test_count_tokens_counts_the_rendered_tools(claude):
    bare = claude.messages.count_tokens(model="fake", messages=ASKED).input_tokens
    with_tools = claude.messages.count_tokens(model="fake", messages=ASKED, tools=[TOOL]).input_tokens
    assert with_tools > bare + len("get_weather")


def test_responses_auto_function_call_whole_and_streamed(oai):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    reply = oai.responses.create(model="fake", input="Weather in Paris?", tools=[tool])
    assert [item.type for item in reply.output] == ["message", "function_call"]
    assert reply.output_text == "Let me check."
    call = reply.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    with oai.responses.stream(model="fake", input="Weather in Paris?", tools=[tool], tool_choice="auto") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert json.loads(final.output[1].arguments) == {"city": "Paris"}
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.done")
    assert kinds[-1] == "response.completed"
    chained = oai.responses.create(model="fake", previous_response_id=reply.id, tools=[tool], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert chained.output[1].type == "function_call"  # the script calls again: the chain was accepted


def raw_stream(url: str, body: dict, headers: dict) -> list[tuple[str, dict]]:
    request = urllib.request.Request(url, data=orjson.dumps(body), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=30) as response:
        frames = response.read().decode().strip().split("\n\n")
    return [(frame.split("\n")[0].removeprefix("event: "), orjson.loads(frame.split("\n")[1].removeprefix("data: ")))
            for frame in frames]


def test_a_failure_mid_stream_is_each_apis_error_event(node, fake):
    fake.answers = lambda request: "A long answer that will not be finished."
    fake.fail_after = 5
    events = raw_stream(f"{node.url}/v1/messages", {"model": "fake", "max_tokens": 100, "stream": True,
                                                    "messages": ASKED}, {"anthropic-version": "2023-06-01"})
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] == "api_error"
    events = raw_stream(f"{node.url}/v1/responses", {"model": "fake", "input": "Hi", "stream": True}, {})
    assert events[0][0] == "response.created" and events[-1][0] == "error"
    assert events[-1][1]["sequence_number"] == len(events) - 1 and events[-1][1]["message"]
