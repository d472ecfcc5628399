"""What a request asks its output to be, and the tool calls it sends back, read field by field.

Structured output (`response_format`, llama.cpp's `grammar` and `json_schema`, Ollama's
`format`) and tools (`tools`, `tool_choice`) are read by `parse_output` into one grammar
(node/serving/structure.py checks schemas and grammars) and an `Output`; the forced-call
schema comes from node/serving/tools.py. The calls an assistant message carries back
(`tool_calls`) are read by `parse_tool_calls`, their arguments bounded in nesting.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from node.api.fields import (MAX_ARGUMENT_NESTING, MAX_CALL_ID, MAX_TOOL_CALLS, MAX_TOOLS, TOOL_NAME, Fields,
                             type_name)
from node.engine.types import GrammarSpec
from node.serving import structure
from node.serving.errors import UnsupportedFeature
from node.serving.requests import Output, Tool, ToolCall
from node.serving.tools import tool_call_schema


def parse_response_format(fields: Fields) -> GrammarSpec | None:
    value = fields.body.get("response_format")
    if value is None:
        return None
    rf = Fields(value, "response_format")
    def nested() -> Fields:
        return Fields(rf.body.get("json_schema"), "response_format.json_schema")

    if rf.present("json_schema") and rf.body.get("type") != "json_schema":
        inner = nested()  # unused beside type text or json_object, but held to its documented shape
        if not isinstance(named_schema(inner), dict):
            raise inner.fail("schema", "must be a JSON object")
    return format_spec(rf, nested)


def format_spec(rf: Fields, schema_fields: Callable[[], Fields]) -> GrammarSpec | None:
    """An output format object (`type` text, json_object or json_schema); `schema_fields` gives
    the object holding `name`, `strict` and `schema` (nested in chat, the format itself in Responses)."""
    kind = rf.string("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return structure.schema_spec(structure.ANY_OBJECT, rf.prefix)
    if kind == "json_schema":
        inner = schema_fields()
        return structure.schema_spec(named_schema(inner), inner.name("schema"))
    raise rf.fail("type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def named_schema(inner: Fields, required: bool = True) -> Any:
    """The `schema` of an object holding `name`, `description`, `strict` and `schema`, each checked
    (`required`: a missing schema is an error; otherwise a present one must be an object)."""
    name = inner.string("name")
    if name is not None and not TOOL_NAME.fullmatch(name):
        raise inner.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
    inner.boolean("strict", False)
    inner.string("description")
    schema = inner.body.get("schema")
    if required and "schema" not in inner.body:
        raise inner.fail("schema", "is required")
    if not required and schema is not None and not isinstance(schema, dict):
        raise inner.fail("schema", "must be a JSON object")
    return schema


def parse_format(fields: Fields) -> GrammarSpec | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON Schema; "" is no format."""
    value = fields.body.get("format")
    if value is None or value == "":
        return None
    if value == "json":
        return structure.schema_spec(structure.ANY_OBJECT, "format")
    if isinstance(value, dict):
        return structure.schema_spec(value, "format")
    raise fields.fail("format", "must be \"json\" or a JSON Schema object")


def parse_tools(fields: Fields) -> tuple[Tool, ...]:
    return parse_tool_list(fields, openai_tool)


def openai_tool(tool: Fields) -> Fields:
    """The function of one chat tool (`{"type": "function", "function": {...}}`)."""
    if tool.string("type") != "function":
        raise UnsupportedFeature(f"Tools of type {tool.string('type')!r} are not supported; only 'function' is",
                                 param=tool.name("type"))
    return Fields(tool.body.get("function"), tool.name("function"))


def parse_tool_list(fields: Fields, function_of: Callable[[Fields], Fields],
                    parameters_key: str = "parameters") -> tuple[Tool, ...]:
    """`fields.tools`: each item's function (found by `function_of`) with its name, description and
    JSON Schema under `parameters_key` (checked as structured output's schemas are)."""
    value = fields.body.get("tools")
    if value is None or value == []:
        return ()
    if not isinstance(value, list):
        raise fields.fail("tools", f"must be an array of tools, got {type_name(value)}")
    if len(value) > MAX_TOOLS:
        raise fields.fail("tools", f"may hold at most {MAX_TOOLS} tools")
    tools: dict[str, Tool] = {}
    for index, item in enumerate(value):
        function = function_of(Fields(item, fields.name(f"tools[{index}]")))
        name = function.string("name")
        if name is None or not TOOL_NAME.fullmatch(name):
            raise function.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
        if name in tools:
            raise function.fail("name", f"{name!r} is defined twice")
        function.boolean("strict", False)
        parameters = function.body.get(parameters_key)
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        structure.schema_spec(parameters, function.name(parameters_key))
        tools[name] = Tool(name, function.string("description") or "", structure.canonical_json(parameters))
    offered = tuple(tools.values())
    structure.schema_spec(tool_call_schema(offered, None), "tools")  # the limits hold for all of them
    return offered


def parse_tool_choice(fields: Fields, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    value = fields.body.get("tool_choice")
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise fields.fail("tool_choice", f"must be 'none', 'auto', 'required' or a function, got {value!r}")
        if value != "none" and not tools:
            raise fields.fail("tool_choice", f"{value!r} needs 'tools'")
        return value, None
    choice = Fields(value, "tool_choice")
    if choice.string("type") != "function":
        raise choice.fail("type", "must be 'function'")
    name = Fields(choice.body.get("function"), "tool_choice.function").string("name")
    if name not in {tool.name for tool in tools}:
        raise choice.fail("function", f"names {name!r}, which is not among 'tools'")
    return "function", name


def parse_output(fields: Fields, *, chat: bool) -> tuple[GrammarSpec | None, Output | None]:
    """The grammar the output must match and what it is (structured output, tool calls)."""
    asked: list[tuple[str, GrammarSpec]] = []
    for param, parse in (("response_format", parse_response_format), ("format", parse_format)):
        spec = parse(fields)
        if spec is not None:
            asked.append((param, spec))
    if fields.present("json_schema"):
        asked.append(("json_schema", structure.schema_spec(fields.body["json_schema"], "json_schema")))
    if fields.present("grammar"):
        asked.append(("grammar", structure.gbnf_spec(fields.body["grammar"], "grammar")))
    tools: tuple[Tool, ...] = ()
    choice, function = "none", None
    if chat:
        tools = parse_tools(fields)
        choice, function = parse_tool_choice(fields, tools)
        fields.boolean("parallel_tool_calls", True)
    else:
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            if fields.present(key):
                raise UnsupportedFeature(f"'{key}' is not supported on /v1/completions (tool calling is a chat "
                                         "feature: use /v1/chat/completions)", param=key)
    return decide_output(asked, tools, choice, function, "tool_choice" if fields.present("tool_choice") else "tools")


def decide_output(asked: list[tuple[str, GrammarSpec]], tools: tuple[Tool, ...], choice: str, function: str | None,
                  auto_param: str = "tools") -> tuple[GrammarSpec | None, Output | None]:
    """The grammar and Output of a request: at most one structured-output field (`asked`, by the
    field that asked), or tool calls by `choice` ("none", "auto", "required", "function")."""
    if choice != "none" and asked:
        raise UnsupportedFeature(f"'{asked[0][0]}' together with tool calls (tool_choice {choice!r}) is not "
                                 "supported: use one or the other", param=asked[0][0])
    if len(asked) > 1:
        raise UnsupportedFeature(f"'{asked[0][0]}' and '{asked[1][0]}' both constrain the output: use one",
                                 param=asked[1][0])
    if choice in ("required", "function"):
        schema = tool_call_schema(tools, function)
        spec = structure.schema_spec(schema, "tools")
        return spec, Output("tools", tools, "required" if choice == "required" else "function", function)
    if choice == "auto":
        return None, Output(auto_param, tools, "auto")
    if asked:
        return asked[0][1], Output(asked[0][0])
    return None, None


def tool_call_items(message: Fields) -> list[Any]:
    """The items of a message's `tool_calls`: a non-empty array within the limit."""
    value = message.body.get("tool_calls")
    if not isinstance(value, list) or not value:
        raise message.fail("tool_calls", f"must be a non-empty array of tool calls, got {type_name(value)}")
    if len(value) > MAX_TOOL_CALLS:
        raise message.fail("tool_calls", f"may hold at most {MAX_TOOL_CALLS} calls")
    return value


def parse_tool_calls(message: Fields) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` (OpenAI's shape; `arguments` a string holding JSON)."""
    if message.body.get("tool_calls") is None:
        return ()
    calls = []
    for index, item in enumerate(tool_call_items(message)):
        call = Fields(item, message.name(f"tool_calls[{index}]"))
        call_id = call.string("id")
        if not call_id or len(call_id) > MAX_CALL_ID:
            raise call.fail("id", f"must be a string of 1 to {MAX_CALL_ID} characters")
        if call.string("type") != "function":
            raise call.fail("type", "must be 'function'")
        calls.append(function_call(Fields(call.body.get("function"), call.name("function")), call_id))
    return tuple(calls)


def function_call(function: Fields, call_id: str, missing_arguments: str = "") -> ToolCall:
    """A call sent back: `function.name` and `function.arguments` (a string holding a JSON object)."""
    name = function.string("name")
    if name is None or not TOOL_NAME.fullmatch(name):
        raise function.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
    arguments = function.string("arguments") or missing_arguments
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        parsed = None
    if not isinstance(parsed, dict):
        raise function.fail("arguments", "must be a string holding a JSON object (the call's arguments)")
    if nesting(parsed) > MAX_ARGUMENT_NESTING:
        raise function.fail("arguments", f"may nest objects and arrays at most {MAX_ARGUMENT_NESTING} deep")
    return ToolCall(call_id, name, arguments)


def nesting(value: Any) -> int:
    """How deep objects and arrays nest in a parsed JSON value (1 for a flat object)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
