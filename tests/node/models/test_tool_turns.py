"""Tool calls and results in a conversation: converted to plain turns for templates without tool
support (Gemma's built-in one), passed through to a template that renders them (an inline
template in the Qwen 2.5 / Hermes style, no model needed)."""

from __future__ import annotations

import json

import pytest

from node.api.schemas import parse_chat
from node.models.templates import ChatTemplate, TemplateError
from node.models.tool_turns import call_text, plain_tool_turns
from node.serving.tools import ToolMarkers

ARGS = {"city": "Paris", "unit": "celsius"}


def call(call_id: str, name: str = "get_weather", arguments: dict = ARGS) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def loop_messages(*, result: str = "18 C, sunny", follow_up: str | None = "Should I take an umbrella?") -> list[dict]:
    messages = [
        {"role": "system", "content": "You help with the weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]
    return messages + ([{"role": "user", "content": follow_up}] if follow_up else [])


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as the service hands them to the template (parsed, then as_dict)."""
    return [message.as_dict() for message in parse_chat({"messages": messages}).messages]


def test_a_call_becomes_the_compact_object_the_forced_grammar_writes():
    text = call_text("get_weather", {"city": "Zürich", "unit": "celsius"})
    assert text == '{"name":"get_weather","arguments":{"city":"Zürich","unit":"celsius"}}'
    # the shape the forced-call reader expects at the start of a call
    assert text.startswith('{"name":"get_weather","arguments":')


def test_calls_and_results_become_alternating_plain_turns():
    turns = plain_tool_turns(template_messages(loop_messages()))
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[2] == {"role": "assistant", "content": call_text("get_weather", ARGS)}
    assert turns[3]["content"] == ("Tool result of get_weather (call call_1):\n18 C, sunny\n\n"
                                   "Should I take an umbrella?")
    assert all(set(t) == {"role", "content"} for t in turns)


def test_several_calls_content_and_results_in_order():
    messages = [
        {"role": "user", "content": "Weather and time in Rome?"},
        {"role": "assistant", "content": "Looking both up.",
         "tool_calls": [call("a"), call("b", "get_time", {"zone": "CET"})]},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "10:00"}]},
        {"role": "tool", "tool_call_id": "a", "content": "rain"},
    ]
    turns = plain_tool_turns(template_messages(messages))
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"] == "\n".join(["Looking both up.", call_text("get_weather", ARGS),
                                             call_text("get_time", {"zone": "CET"})])
    assert turns[2]["content"] == ("Tool result of get_time (call b):\n10:00\n\n"
                                   "Tool result of get_weather (call a):\nrain")


def test_messages_without_tools_are_left_alone():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert plain_tool_turns(messages) == messages  # not merged: no tool turn is involved


def test_gemma_renders_the_loop_and_its_alternation_holds():
    gemma = ChatTemplate.builtin("gemma")
    assert not gemma.renders_tools
    text = gemma.render(template_messages(loop_messages()))
    assert text == ("<start_of_turn>user\nYou help with the weather.\n\nWeather in Paris?<end_of_turn>\n"
                    "<start_of_turn>model\n" + call_text("get_weather", ARGS) + "<end_of_turn>\n"
                    "<start_of_turn>user\nTool result of get_weather (call call_1):\n18 C, sunny\n\n"
                    "Should I take an umbrella?<end_of_turn>\n<start_of_turn>model\n")
    # ending on the tool result: the model answers right after it
    assert gemma.render(template_messages(loop_messages(follow_up=None))).endswith(
        "18 C, sunny<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(TemplateError):  # two plain user turns are still the template's error
        gemma.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


# A template in the style of Qwen 2.5 / Hermes: tools in the system turn, calls between
# <tool_call> markers with the arguments as JSON, results in <tool_response> inside a user turn.
NATIVE = """\
{%- if tools %}<|im_start|>system
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% elif message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{{ message.content }}
{%- for tool_call in message.tool_calls %}
<tool_call>{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_template_that_renders_tools_gets_the_messages_as_they_are():
    native = ChatTemplate("test:native", NATIVE, ("<|im_end|>",))
    assert native.renders_tools and ToolMarkers.of_template(native.source) == ToolMarkers("<tool_call>", "</tool_call>")
    text = native.render(template_messages(loop_messages(follow_up=None)))
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>18 C, sunny</tool_response><|im_end|>\n" in text
    assert "Tool result of" not in text and text.endswith("<|im_start|>assistant\n")
