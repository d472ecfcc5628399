"""OpenAI Responses request bodies, checked field by field into a ChatRequest and what to store.

`input` is a string (one user message) or a list of items: messages (`role` user, system,
developer or assistant; content a string or `input_text` / `output_text` parts), `function_call`
items (a call the model made, by `call_id`) and `function_call_output` items (its result).
`instructions` is a system message for this response only (it is not carried to the next
one, as OpenAI's `instructions` are not). `max_output_tokens`, `temperature` and `top_p` go to
sampling as chat's fields do; `text.format` (json_schema, json_object, text) is structured
output; `tools` (type "function", name, description, parameters) and `tool_choice` (none, auto,
required, or a function by name) decide tool calls as chat's do (node/api/schemas.py).
`previous_response_id` and `store` are read here and resolved by the route (the stored chain
lives in the archive, node/api/responses_store.py). Built-in tools, reasoning, images and files
are refused with a clear 400.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from node.api.fields import DEFAULT_CHAT_MAX_TOKENS, MAX_CALL_ID, MAX_MESSAGES, MAX_TOKENS_LIMIT, Fields
from node.api.output_schemas import (decide_output, format_spec, function_call, named_schema, parse_tool_choice,
                                     parse_tool_list)
from node.api.schemas import parse_content, parse_sampling
from node.engine.types import GrammarSpec
from node.serving.errors import UnsupportedFeature
from node.serving.requests import ChatMessage, GenerationOptions

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text")
MAX_METADATA = 16
UNSUPPORTED = {"reasoning": "reasoning", "background": "background responses", "conversation": "conversations",
               "prompt": "prompt templates"}


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    model: str | None
    instructions: str | None
    input: tuple[ChatMessage, ...]   # this request's own items, as chat messages
    options: GenerationOptions
    previous_response_id: str | None
    store: bool
    metadata: dict[str, str]
    text_format: dict[str, Any]      # echoed in the response's `text.format`


def content_text(value: Any, param: str) -> str:
    return parse_content(value, param, TEXT_PARTS)


def call_id_of(item: Fields) -> str:
    call_id = item.string("call_id")
    if not call_id or len(call_id) > MAX_CALL_ID:
        raise item.fail("call_id", f"must be a string of 1 to {MAX_CALL_ID} characters")
    return call_id


def parse_items(value: Any, calls: dict[str, str]) -> tuple[ChatMessage, ...]:
    """`input` as chat messages; `calls` maps the call ids known so far (the chain's) to functions."""
    if isinstance(value, str):
        return (ChatMessage("user", value),)
    if not isinstance(value, list) or not value:
        raise Fields({}).fail("input", "must be a string or a non-empty array of input items")
    if len(value) > MAX_MESSAGES:
        raise Fields({}).fail("input", f"may hold at most {MAX_MESSAGES} items")
    messages: list[ChatMessage] = []
    for index, raw in enumerate(value):
        item = Fields(raw, f"input[{index}]")
        kind = item.string("type") or "message"
        if kind == "message":
            role = item.string("role")
            if role not in ROLES:
                raise item.fail("role", f"must be one of {', '.join(ROLES)}")
            messages.append(ChatMessage(ROLES[role], content_text(item.body.get("content"), item.name("content"))))
        elif kind == "function_call":
            call = function_call(item, call_id_of(item), "{}")
            calls[call.id] = call.name
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and last.tool_calls:
                messages[-1] = dataclasses.replace(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = call_id_of(item)
            if call_id not in calls:
                raise item.fail("call_id", f"{call_id!r} answers no function_call of this input or of the "
                                           "previous responses")
            output = item.body.get("output")
            text = output if isinstance(output, str) else content_text(output, item.name("output"))
            messages.append(ChatMessage("tool", text, tool_call_id=call_id, name=calls[call_id]))
        else:
            raise UnsupportedFeature(f"Input items of type {kind!r} are not supported; only messages, "
                                     "'function_call' and 'function_call_output' are", param=item.name("type"))
    return tuple(messages)


def responses_tool(tool: Fields) -> Fields:
    if tool.string("type") != "function":
        raise UnsupportedFeature(f"Tools of type {tool.string('type')!r} are not supported; only 'function' is",
                                 param=tool.name("type"))
    return tool


def parse_text_format(fields: Fields) -> tuple[GrammarSpec | None, dict[str, Any]]:
    text = fields.body.get("text")
    if text is None:
        return None, {"type": "text"}
    value = Fields(text, "text").body.get("format")
    if value is None:
        return None, {"type": "text"}
    rf = Fields(value, "text.format")
    if rf.body.get("type") != "json_schema":  # unused beside type text or json_object, but held to their shape
        named_schema(rf, required=False)
    return format_spec(rf, lambda: rf), dict(rf.body)


def parse_responses_body(body: Any, calls: dict[str, str]) -> ResponsesRequest:
    """A /v1/responses body; `calls`: the call ids of the chain it continues (filled with its own)."""
    fields = Fields(body)
    for key, feature in UNSUPPORTED.items():
        if fields.present(key):
            raise UnsupportedFeature(f"{feature.capitalize()} ('{key}') is not supported by this server", param=key)
    instructions = fields.string("instructions")
    if "input" not in fields.body:
        raise fields.fail("input", "is required")
    messages = parse_items(fields.body["input"], calls)
    grammar, text_format = parse_text_format(fields)
    tools = parse_tool_list(fields, responses_tool)
    choice, function = parse_responses_choice(fields, tools)
    fields.boolean("parallel_tool_calls", True)
    asked = [("text.format", grammar)] if grammar is not None else []
    grammar, output = decide_output(asked, tools, choice, function,
                                    "tool_choice" if fields.present("tool_choice") else "tools")
    metadata = fields.body.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise fields.fail("metadata", "must be an object of strings")
    if len(metadata) > MAX_METADATA:
        raise fields.fail("metadata", f"may hold at most {MAX_METADATA} keys")
    return ResponsesRequest(
        model=fields.string("model"), instructions=instructions, input=messages,
        options=GenerationOptions(
            max_tokens=fields.integer("max_output_tokens", DEFAULT_CHAT_MAX_TOKENS, 1, MAX_TOKENS_LIMIT),
            sampling=dataclasses.replace(parse_sampling(fields), grammar=grammar), stop=(), n=1, logprobs=None,
            stream=fields.boolean("stream", False), include_usage=False, output=output),
        previous_response_id=fields.string("previous_response_id"),
        store=fields.boolean("store", True), metadata=dict(metadata), text_format=text_format,
    )


def parse_responses_choice(fields: Fields, tools: Any) -> tuple[str, str | None]:
    """`tool_choice`: chat's strings, or `{"type": "function", "name"}` (the name at the top)."""
    value = fields.body.get("tool_choice")
    if isinstance(value, dict) and "function" not in value:
        choice = Fields(value, "tool_choice")
        if choice.string("type") != "function":
            raise choice.fail("type", "must be 'function'")
        name = choice.string("name")
        if name not in {tool.name for tool in tools}:
            raise choice.fail("name", f"names {name!r}, which is not among 'tools'")
        return "function", name
    return parse_tool_choice(fields, tools)
