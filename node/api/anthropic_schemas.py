"""Anthropic Messages request bodies, checked field by field into the serving layer's ChatRequest.

`system` (a string or text blocks) becomes the system message; `messages` alternate user and
assistant turns whose content is a string or blocks: `text`, `tool_use` (assistant: a call,
its `input` the arguments) and `tool_result` (user: the answer to an earlier `tool_use` by its
`tool_use_id`, rendered as a "tool" message as chat's tool results are). `max_tokens` is
required, as Anthropic requires it (count_tokens takes none). `stop_sequences`, `temperature`,
`top_p` and `top_k` go to sampling as chat's fields do (node/api/schemas.py); `metadata` is
accepted and changes nothing. `tools` (name, description, `input_schema`) and `tool_choice`
(auto, any, tool, none) decide the output as chat's tools do: `any` is a required call, `tool`
a named one. `output_config.format` (`json_schema` with a `schema`) is structured output. Images,
documents and server tools are refused with a clear 400.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from node.api.fields import (DEFAULT_CHAT_MAX_TOKENS, MAX_ARGUMENT_NESTING, MAX_CALL_ID, MAX_MESSAGES, MAX_TOKENS_LIMIT,
                             TOOL_NAME, Fields, type_name)
from node.api.output_schemas import decide_output, format_spec, nesting, parse_tool_list
from node.api.schemas import parse_content, parse_sampling, parse_stop
from node.engine.types import GrammarSpec
from node.serving.errors import UnsupportedFeature
from node.serving.requests import ChatMessage, ChatRequest, GenerationOptions, Tool, ToolCall

ROLES = ("user", "assistant")


def tool_use(block: Fields, calls: dict[str, str]) -> ToolCall:
    call_id = block.string("id")
    if not call_id or len(call_id) > MAX_CALL_ID:
        raise block.fail("id", f"must be a string of 1 to {MAX_CALL_ID} characters")
    if call_id in calls:
        raise block.fail("id", f"repeats the tool use id {call_id!r}")
    name = block.string("name")
    if name is None or not TOOL_NAME.fullmatch(name):
        raise block.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
    arguments = block.body.get("input")
    if not isinstance(arguments, dict):
        raise block.fail("input", "must be an object (the call's arguments)")
    if nesting(arguments) > MAX_ARGUMENT_NESTING:
        raise block.fail("input", f"may nest objects and arrays at most {MAX_ARGUMENT_NESTING} deep")
    calls[call_id] = name
    return ToolCall(call_id, name, json.dumps(arguments, separators=(",", ":"), ensure_ascii=False))


def parse_turn(message: Fields, calls: dict[str, str]) -> list[ChatMessage]:
    """One Anthropic message as chat messages: tool results become "tool" messages."""
    role = message.string("role")
    if role not in ROLES:
        raise message.fail("role", "must be 'user' or 'assistant'")
    content = message.body.get("content")
    if isinstance(content, str):
        return [ChatMessage(role, content)]
    if not isinstance(content, list):
        raise message.fail("content", f"must be a string or an array of content blocks, got {type_name(content)}")
    out: list[ChatMessage] = []
    texts: list[str] = []
    tool_calls: list[ToolCall] = []
    for index, item in enumerate(content):
        block = Fields(item, message.name(f"content[{index}]"))
        kind = block.string("type")
        if kind == "text":
            text = block.string("text")
            if text is None:
                raise block.fail("text", "is required")
            texts.append(text)
        elif kind == "tool_use" and role == "assistant":
            tool_calls.append(tool_use(block, calls))
        elif kind == "tool_result" and role == "user":
            call_id = block.string("tool_use_id")
            if call_id is None or call_id not in calls:
                raise block.fail("tool_use_id", f"{call_id!r} answers no tool_use block of an earlier assistant "
                                                "message")
            block.boolean("is_error", False)
            result = block.body.get("content")
            text = "" if result is None else parse_content(result, block.name("content"))
            out.append(ChatMessage("tool", text, tool_call_id=call_id, name=calls[call_id]))
        elif kind in ("tool_use", "tool_result"):
            raise block.fail("type", f"{kind!r} blocks belong in {'assistant' if kind == 'tool_use' else 'user'} "
                                     "messages")
        else:
            raise UnsupportedFeature(f"Content blocks of type {kind!r} are not supported; only 'text', 'tool_use' "
                                     "and 'tool_result' are", param=block.name("type"))
    if texts or tool_calls or not out:
        out.append(ChatMessage(role, "".join(texts), tool_calls=tuple(tool_calls)))
    return out


def anthropic_tool(tool: Fields) -> Fields:
    kind = tool.string("type")
    if kind not in (None, "custom"):
        raise UnsupportedFeature(f"Tools of type {kind!r} (server tools) are not supported; only custom tools "
                                 "with an 'input_schema' are", param=tool.name("type"))
    return tool


def parse_tool_choice(fields: Fields, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    value = fields.body.get("tool_choice")
    if value is None:
        return ("auto" if tools else "none"), None
    choice = Fields(value, "tool_choice")
    kind = choice.string("type")
    choice.boolean("disable_parallel_tool_use", False)
    if kind == "none":
        return "none", None
    if kind not in ("auto", "any", "tool"):
        raise choice.fail("type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
    if not tools:
        raise choice.fail("type", f"{kind!r} needs 'tools'")
    if kind == "tool":
        name = choice.string("name")
        if name not in {tool.name for tool in tools}:
            raise choice.fail("name", f"names {name!r}, which is not among 'tools'")
        return "function", name
    return ("required" if kind == "any" else "auto"), None


def parse_output_format(fields: Fields) -> list[tuple[str, GrammarSpec]]:
    """Structured output: `output_config.format` (`{"type": "json_schema", "schema"}`)."""
    config = fields.body.get("output_config")
    if config is None:
        return []
    value = Fields(config, "output_config").body.get("format")
    if value is None:
        return []
    rf = Fields(value, "output_config.format")
    if rf.string("type") != "json_schema":
        raise rf.fail("type", "must be 'json_schema'")
    spec = format_spec(rf, lambda: rf)
    return [] if spec is None else [("output_config.format", spec)]


def parse_stop_sequences(fields: Fields) -> tuple[str, ...]:
    if fields.present("stop_sequences") and not isinstance(fields.body["stop_sequences"], list):
        raise fields.fail("stop_sequences", "must be an array of strings")
    return parse_stop(fields, "stop_sequences")


def parse_messages_body(body: Any, *, count_only: bool = False) -> ChatRequest:
    """A /v1/messages body (or a count_tokens body, which has no `max_tokens`)."""
    fields = Fields(body)
    if not count_only and not fields.present("max_tokens"):
        raise fields.fail("max_tokens", "is required (the most tokens to generate)")
    max_tokens = fields.integer("max_tokens", DEFAULT_CHAT_MAX_TOKENS, 1, MAX_TOKENS_LIMIT)
    if fields.present("metadata"):
        Fields(fields.body["metadata"], "metadata").string("user_id")
    messages: list[ChatMessage] = []
    system = fields.body.get("system")
    if system is not None:
        messages.append(ChatMessage("system", parse_content(system, "system")))
    value = fields.body.get("messages")
    if not isinstance(value, list) or not value:
        raise fields.fail("messages", "must be a non-empty array of messages")
    if len(value) > MAX_MESSAGES:
        raise fields.fail("messages", f"may hold at most {MAX_MESSAGES} messages")
    calls: dict[str, str] = {}
    for index, item in enumerate(value):
        messages.extend(parse_turn(Fields(item, f"messages[{index}]"), calls))
    tools = parse_tool_list(fields, anthropic_tool, "input_schema")
    choice, function = parse_tool_choice(fields, tools)
    grammar, output = decide_output(parse_output_format(fields), tools, choice, function,
                                    "tool_choice" if fields.present("tool_choice") else "tools")
    sampling = parse_sampling(fields)
    return ChatRequest(
        model=fields.string("model"), messages=tuple(messages),
        options=GenerationOptions(
            max_tokens=max_tokens, sampling=dataclasses.replace(sampling, grammar=grammar),
            stop=parse_stop_sequences(fields), n=1, logprobs=None, stream=fields.boolean("stream", False),
            include_usage=False, output=output),
    )

