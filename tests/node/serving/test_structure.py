"""Structured output without a model: request fields into grammars, bad schemas as 400s naming
the field, tool calls read back from text (streamed and whole), Il Suggeritore's form rules."""

from __future__ import annotations

import json

import pytest

from node.api.errors import error_reply
from node.api.schemas import parse_chat, parse_completion
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving import structure
from node.serving.requests import Output, Tool
from node.serving.tools import ToolCallReader, ToolMarkers, parse_marked_calls, tool_call_schema
from node.speculative.format import (rule_close, rule_indent, rule_list, rule_list_end, rule_prefix,
                                     rule_table)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def checked_chat(body):
    """Parsed, then checked as the node checks it off the event loop (structure.verify)."""
    req = parse_chat(body)
    structure.verify_all(structure.checks(req.options))
    return req
TEXT = {"prompt": "hi"}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.mark.parametrize("extra, kind, param", [
    ({"response_format": {"type": "json_object"}}, "json_schema", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}},
     "json_schema", "response_format"),
    ({"json_schema": PERSON}, "json_schema", "json_schema"),
    ({"grammar": 'root ::= "yes" | "no"'}, "gbnf", "grammar"),
    ({"format": "json"}, "json_schema", "format"),
    ({"format": PERSON}, "json_schema", "format"),
])
def test_every_dialect_becomes_one_grammar(extra, kind, param):
    for parse, base in ((parse_chat, CHAT), (parse_completion, TEXT)):
        options = parse({**base, **extra}).options
        assert options.sampling.grammar is not None and options.sampling.grammar.kind == kind
        assert options.output == Output(param)


def test_schema_text_keeps_the_property_order():
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    spec = parse_chat({**CHAT, "json_schema": schema}).options.sampling.grammar
    assert spec is not None and list(json.loads(spec.text)["properties"]) == ["b", "a"]


def test_text_response_format_and_tool_choice_none_are_plain():
    assert parse_chat({**CHAT, "response_format": {"type": "text"}}).options.sampling.grammar is None
    options = parse_chat({**CHAT, "tools": [WEATHER], "tool_choice": "none"}).options
    assert options.sampling.grammar is None and options.output is None


def test_forced_tool_calls():
    named = parse_chat({**CHAT, "tools": [WEATHER], "tool_choice": {"type": "function",
                                                                    "function": {"name": "get_weather"}}})
    assert named.options.output is not None and named.options.output.choice == "function"
    required = parse_chat({**CHAT, "tools": [WEATHER], "tool_choice": "required"}).options
    assert required.output is not None and required.output.forced_call
    assert required.sampling.grammar is not None
    schema = json.loads(required.sampling.grammar.text)
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert list(schema["properties"]) == ["name", "arguments"]
    auto = parse_chat({**CHAT, "tools": [WEATHER]}).options
    assert auto.output is not None and auto.output.choice == "auto" and auto.sampling.grammar is None


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     InvalidRequest, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "minLength": -1}}}}}},
     InvalidRequest, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     InvalidRequest, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}},
     UnsupportedFeature, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": PERSON}}},
     InvalidRequest, "response_format.json_schema.name"),
    ({"response_format": {"type": "xml"}}, InvalidRequest, "response_format.type"),
    ({"response_format": "json"}, InvalidRequest, "response_format"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, UnsupportedFeature, "json_schema"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, UnsupportedFeature, "json_schema"),
    ({"json_schema": {"$ref": "https://example.com/schema.json"}}, UnsupportedFeature, "json_schema"),
    ({"json_schema": {"type": "object", "not": {"required": ["a"]}}}, UnsupportedFeature, "json_schema"),
    ({"json_schema": [1]}, InvalidRequest, "json_schema"),
    ({"grammar": "root ::= ("}, InvalidRequest, "grammar"),
    ({"grammar": ""}, InvalidRequest, "grammar"),
    ({"grammar": 'other ::= "x"'}, InvalidRequest, "grammar"),
    ({"format": "yaml"}, InvalidRequest, "format"),
    ({"format": PERSON, "json_schema": PERSON}, UnsupportedFeature, "json_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     InvalidRequest, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, InvalidRequest, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, InvalidRequest, "tools[1].function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, InvalidRequest, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     InvalidRequest, "tool_choice.function"),
    ({"tool_choice": "required"}, InvalidRequest, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     UnsupportedFeature, "response_format"),
]


@pytest.mark.parametrize("extra, error, param", BAD)
def test_bad_structure_is_a_400_naming_the_field(extra, error, param):
    with pytest.raises(error) as caught:
        checked_chat({**CHAT, **extra})
    assert caught.value.param == param and caught.value.message
    assert error_reply(caught.value).status == 400


def test_tools_are_a_chat_feature():
    with pytest.raises(UnsupportedFeature) as caught:
        parse_completion({**TEXT, "tools": [WEATHER]})
    assert caught.value.param == "tools"


MARKERS = ToolMarkers("<tool_call>", "</tool_call>")
QWEN_TEMPLATE = "{%- if tools %}...<tool_call>\n{\"name\": ...}\n</tool_call>{%- endif %}"


def test_markers_come_from_templates_that_render_tools():
    assert ToolMarkers.of_template(QWEN_TEMPLATE) == MARKERS
    assert ToolMarkers.of_template("{{ messages }}<start_of_turn>") is None


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
     '{"name": "b", "arguments": {"x": 1}}\n</tool_call>', "Let me check.", [("a", {}), ("b", {"x": 1})]),
    ("No call here.", "No call here.", []),
    ('<tool_call>\n{"name": "a", "arguments": {"x": \n</tool_call>', None, []),  # broken JSON: text kept
    ('<tool_call>{"name": "a", "arguments": "{\\"q\\": 2}"}</tool_call>', "", [("a", {"q": 2})]),
])
def test_marked_calls_are_parsed_from_text(text, content, calls):
    got_content, got = parse_marked_calls(text, MARKERS)
    assert got_content == (text if content is None else content)
    assert [(call.name, json.loads(call.arguments)) for call in got] == calls
    assert all(call.id.startswith("call_") for call in got)


def forced_output() -> Output:
    return Output("tools", (Tool("get_weather", "", '{"type":"object"}'),), "function", "get_weather")


def test_a_forced_call_streams_its_name_then_its_arguments():
    reader = ToolCallReader(forced_output(), None)
    text = '{"name":"get_weather","arguments":{"city":"Paris","days":2}}'
    pieces = []
    for i in range(0, len(text), 5):
        pieces += reader.feed(text[i:i + 5])
    tail, reason = reader.finish("stop")
    pieces += tail
    assert reason == "tool_calls"
    first = pieces[0]
    assert first[0] == "call" and first[2]["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(p[2]["function"]["arguments"] for p in pieces[1:])
    assert json.loads(arguments) == {"city": "Paris", "days": 2}
    assert reader.calls[0].arguments == arguments and reader.content() is None


def test_a_forced_call_cut_by_max_tokens_is_a_call_with_its_partial_arguments():
    reader = ToolCallReader(forced_output(), None)
    pieces = reader.feed('{"name":"get_weather","arguments":{"ci')
    tail, reason = reader.finish("length")
    streamed = "".join(p[2]["function"]["arguments"] for p in pieces + tail if p[0] == "call")
    assert reason == "length" and reader.content() is None
    assert [(call.name, call.arguments) for call in reader.calls] == [("get_weather", '{"ci')]
    assert streamed == '{"ci'


def test_a_forced_call_cut_before_its_name_is_neither_call_nor_content():
    reader = ToolCallReader(forced_output(), None)
    assert reader.feed('{"name":"get_wea') == []
    assert reader.finish("length") == ([], "length") and not reader.calls and reader.content() is None


def test_auto_streams_content_and_holds_back_a_partial_marker():
    reader = ToolCallReader(Output("tools", (), "auto"), MARKERS)
    out = reader.feed("Sure. <tool_")
    assert out == [("content", "Sure. ")]
    assert reader.feed('call>{"name": "f", "arguments": {"a": 1}}</tool_call>') == []
    tail, reason = reader.finish("stop")
    assert reason == "tool_calls" and tail[-1][0] == "call" and tail[-1][2]["function"]["name"] == "f"
    plain = ToolCallReader(Output("tools", (), "auto"), MARKERS)
    assert plain.feed("Just text <") == [("content", "Just text ")]
    assert plain.finish("stop") == ([("content", "<")], "stop")


def test_the_call_schema_covers_each_allowed_function():
    tools = (Tool("a", "", '{"type":"object"}'), Tool("b", "", '{"type":"object"}'))
    assert len(tool_call_schema(tools, None)["anyOf"]) == 2
    assert tool_call_schema(tools, "b")["properties"]["name"] == {"const": "b"}


@pytest.mark.parametrize("rule, lines, expected", [
    (rule_list, ["1. Apple", "2. Pear", ""], "3."),
    (rule_list, ["  9) nine", ""], "  10)"),
    (rule_list, ["- milk", ""], "-"),
    (rule_list, ["plain", ""], None),
    (rule_list, ["1. Apple", "2."], None),
    (rule_list_end, ["1. Apple", "2. Pe"], None),  # shorter than every earlier item: not yet
    (rule_list_end, ["1. Apple", "2. Peach"], "\n3."),
    (rule_list_end, ["* one"], "\n*"),
    (rule_list_end, ["2. "], None),
    (rule_table, ["| a | b |", ""], "|---|---|"),
    (rule_table, ["| a | b |", "|---|---|", ""], "|"),
    (rule_table, ["| a | b |", "|---|---|", "| 1 | 2 |", ""], "|"),
    (rule_table, ["| a | b |", "| 1 | 2"], " |\n|"),
    (rule_table, ["text", ""], None),
    (rule_indent, ["def f(x):", ""], "    "),
    (rule_indent, ["    return x", ""], "    "),
    (rule_indent, ["x = 1", ""], None),
    (rule_close, ['print(d["key"'], "])"),
    (rule_close, ['x = "open'], None),
    (rule_prefix, ["Q: one?", "A: yes", "Q: two?", ""], "A:"),
    (rule_prefix, ["Q: one?", "A: yes", "Q: two?", "A: no", ""], "Q:"),
    (rule_prefix, ["hello", "world", ""], None),
])
def test_form_rules(rule, lines, expected):
    assert rule(lines) == expected
