"""Tool calls and tool results sent back in `messages`, through the real app on a loopback socket.

The engine is the fake one (tests/node/fake_engine.py, Gemma's built-in template, one token per
byte), so the test reads back the exact prompt the model would get: what is checked here is
validation (every bad shape a 400 naming the field), the conversion for a template without tool
support, the L1 key and session turns, not what a model answers. The loop on the real model
is in test_structured_output.py.
"""

from __future__ import annotations

import json

import pytest

from node.models.tool_turns import call_text
from tests.node.api.live import http_json
from tests.node.api.test_http_fake import fake, node  # noqa: F401  (the fake engine and its live node)

ARGS = {"city": "Paris", "unit": "celsius"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}
ASKED = {"role": "user", "content": "Weather in Paris?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}


def chat(node, messages, headers=None, **extra):
    body = {"messages": messages, "max_tokens": 40, "temperature": 0, **extra}
    return http_json("POST", f"{node.url}/v1/chat/completions", body, headers)


def prompt_text(fake) -> str:
    return bytes(t for t in fake.submitted[-1].prompt_tokens if t < 256).decode()


def with_call(**changes):
    return {**CALLED, "tool_calls": [{**CALL, **changes}]}


def with_function(**changes):
    return with_call(function={**CALL["function"], **changes})


@pytest.mark.parametrize("messages, param", [
    ([ASKED, with_call(id=None), RESULT], "messages[1].tool_calls[0].id"),
    ([ASKED, with_call(id=7), RESULT], "messages[1].tool_calls[0].id"),
    ([ASKED, with_call(id=""), RESULT], "messages[1].tool_calls[0].id"),
    ([ASKED, with_call(type="retrieval"), RESULT], "messages[1].tool_calls[0].type"),
    ([ASKED, with_call(type=None), RESULT], "messages[1].tool_calls[0].type"),
    ([ASKED, with_call(function="get_weather"), RESULT], "messages[1].tool_calls[0].function"),
    ([ASKED, with_function(name=None), RESULT], "messages[1].tool_calls[0].function.name"),
    ([ASKED, with_function(name="no spaces"), RESULT], "messages[1].tool_calls[0].function.name"),
    ([ASKED, with_function(arguments=ARGS), RESULT], "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments="{not json"), RESULT], "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments="[1, 2]"), RESULT], "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments=None), RESULT], "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments="[" * 100_000), RESULT], "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments='{"a":' + "[" * 65 + "]" * 65 + "}"), RESULT],
     "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, with_function(arguments='{"a":' * 50_000 + "1" + "}" * 50_000), RESULT],
     "messages[1].tool_calls[0].function.arguments"),
    ([ASKED, {**CALLED, "tool_calls": "call_1"}, RESULT], "messages[1].tool_calls"),
    ([ASKED, {**CALLED, "tool_calls": []}], "messages[1].tool_calls"),
    ([ASKED, {**CALLED, "tool_calls": [CALL] * 129}], "messages[1].tool_calls"),
    ([ASKED, {**CALLED, "tool_calls": ["call_1"]}, RESULT], "messages[1].tool_calls[0]"),
    ([ASKED, {**CALLED, "tool_calls": [CALL, CALL]}, RESULT], "messages[1].tool_calls"),
    ([ASKED, CALLED, RESULT, CALLED, RESULT], "messages[3].tool_calls"),  # an id used again
    ([{**ASKED, "tool_calls": [CALL]}, RESULT], "messages[0].tool_calls"),
    ([ASKED, {"role": "assistant", "content": None}], "messages[1].content"),
    ([ASKED, {"role": "assistant"}], "messages[1].content"),
    ([ASKED, {**CALLED, "content": 5}, RESULT], "messages[1].content"),
    ([ASKED, CALLED, {**RESULT, "tool_call_id": None}], "messages[2].tool_call_id"),
    ([ASKED, CALLED, {**RESULT, "tool_call_id": 1}], "messages[2].tool_call_id"),
    ([ASKED, CALLED, {**RESULT, "tool_call_id": "call_2"}], "messages[2].tool_call_id"),
    ([ASKED, RESULT, CALLED], "messages[1].tool_call_id"),  # answers a later call
    ([ASKED, CALLED, {**RESULT, "content": None}], "messages[2].content"),
    ([ASKED, CALLED, {**RESULT, "content": {"temp": 18}}], "messages[2].content"),
    ([ASKED, CALLED, {**RESULT, "content": [{"type": "text"}]}], "messages[2].content[0].text"),
])
def test_bad_tool_messages_are_400s_naming_the_field(node, messages, param):
    status, _, body = chat(node, messages)
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert param in body["error"]["message"]


@pytest.mark.parametrize("message, param", [
    ({"role": "function", "name": "get_weather", "content": "18 C"}, "messages[1].role"),
    ({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}, "messages[1]"),
])
def test_the_deprecated_function_messages_say_what_to_use(node, message, param):
    status, _, body = chat(node, [ASKED, message])
    assert status == 400 and body["error"]["code"] == "unsupported_feature" and body["error"]["param"] == param
    assert "'tool" in body["error"]["message"]


def test_the_loop_reaches_the_model_as_alternating_plain_turns(node, fake):
    status, _, body = chat(node, [ASKED, CALLED, RESULT])
    assert status == 200 and body["choices"][0]["message"]["content"].startswith("Fake answer")
    assert prompt_text(fake) == (
        "<start_of_turn>user\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n"
        + call_text("get_weather", ARGS) + "<end_of_turn>\n"
        "<start_of_turn>user\nTool result of get_weather (call call_1):\n18 C, sunny<end_of_turn>\n"
        "<start_of_turn>model\n")
    # content parts, a follow-up question merged into the result's turn, and a forced second call
    follow = {"role": "user", "content": "And in Rome?"}
    parts = {**RESULT, "content": [{"type": "text", "text": "18 C, "}, {"type": "text", "text": "sunny"}]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    status, _, body = chat(node, [ASKED, CALLED, parts, follow], tools=[tool], tool_choice="required")
    assert status == 200
    text = prompt_text(fake)
    assert "18 C, sunny\n\nAnd in Rome?<end_of_turn>\n<start_of_turn>model\n" in text
    assert text.startswith("<start_of_turn>user\nCall one of these functions.") and "Tool result of" in text


def test_the_l1_key_covers_the_tool_result(node):
    first = chat(node, [ASKED, CALLED, RESULT])
    node.call(node.state.service.drain())
    again = chat(node, [ASKED, CALLED, RESULT])
    other = chat(node, [ASKED, CALLED, {**RESULT, "content": "19 C, sunny"}])
    other_args = chat(node, [ASKED, with_function(arguments='{"city": "Rome", "unit": "celsius"}'),
                             RESULT])
    assert first[0] == again[0] == other[0] == other_args[0] == 200
    assert again[1]["X-Reame-Cache"] == "hit" and again[2]["choices"] == first[2]["choices"]
    assert other[1]["X-Reame-Cache"] == "miss" and other_args[1]["X-Reame-Cache"] == "miss"


def test_a_session_keeps_tool_turns_and_renders_them_the_same_way(node, fake):
    status, _, created = http_json("POST", f"{node.url}/v1/sessions", None)
    sid = created["id"]
    header = {"X-Reame-Session": sid}
    assert chat(node, [{"role": "user", "content": "Hello"}], header)[0] == 200
    status, _, body = chat(node, [ASKED, CALLED, RESULT], header)
    assert status == 200, body
    in_session = prompt_text(fake)
    status, _, shown = http_json("GET", f"{node.url}/v1/sessions/{sid}")
    history = shown["history"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert history[3]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ARGS}
    assert history[4]["tool_call_id"] == "call_1" and history[4]["name"] == "get_weather"
    # the turn's prompt is the whole conversation rendered at once, token for token
    status, _, _ = chat(node, [{"role": "user", "content": "Hello"},
                               {"role": "assistant", "content": history[1]["content"]}, ASKED, CALLED, RESULT])
    assert status == 200 and prompt_text(fake) == in_session


def test_a_forced_call_in_a_session_is_answered_in_the_next_turn(node, fake):
    sid = http_json("POST", f"{node.url}/v1/sessions", None)[2]["id"]
    header = {"X-Reame-Session": sid}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.answers = lambda request: call_text("get_weather", ARGS)
    try:
        status, _, body = chat(node, [ASKED], header, tools=[tool], tool_choice="required", max_tokens=200)
    finally:
        fake.answers = None
    assert status == 200 and body["choices"][0]["finish_reason"] == "tool_calls"
    made = body["choices"][0]["message"]["tool_calls"][0]
    assert made["function"] == {"name": "get_weather", "arguments": json.dumps(ARGS, separators=(",", ":"))}
    history = http_json("GET", f"{node.url}/v1/sessions/{sid}")[2]["history"]
    assert history[-1]["tool_calls"] == [{"id": made["id"], "type": "function",
                                          "function": {"name": "get_weather", "arguments": ARGS}}]

    status, _, body = chat(node, [{**RESULT, "tool_call_id": "call_other"}], header)
    assert status == 400 and body["error"]["param"] == "messages[0].tool_call_id"
    status, _, body = chat(node, [{**RESULT, "tool_call_id": made["id"]}], header)
    assert status == 200, body
    assert prompt_text(fake).endswith(
        "<start_of_turn>model\n" + call_text("get_weather", ARGS) + "<end_of_turn>\n"
        f"<start_of_turn>user\nTool result of get_weather (call {made['id']}):\n18 C, sunny<end_of_turn>\n"
        "<start_of_turn>model\n")
    history = http_json("GET", f"{node.url}/v1/sessions/{sid}")[2]["history"]
    # the first turn's function list (a system message for Gemma) stays in the history
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "assistant"]
