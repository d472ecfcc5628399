"""OpenAI request bodies, type-checked field by field into the serving layer's frozen requests.

Every field is checked for its JSON type and range (node/api/fields.py reads them and holds
the limits); a failure is an `InvalidRequest` naming the field (`param`). Real OpenAI features this node does not offer (images, audio, ...) are
refused with `UnsupportedFeature` instead of being ignored. Structured output (`response_format`,
`grammar`, `json_schema`, `format`) and tools are read by `parse_output` into a grammar and
an `Output`, the calls a message sends back by `parse_tool_calls` (node/api/output_schemas.py).
Unknown fields that do not change the output (`user`, `metadata`, `store`, ...) are ignored.
Chat messages may carry the tool-calling loop: assistant messages with `tool_calls`, and "tool"
messages answering one of them by `tool_call_id` (an id of an earlier message's call).
Nothing here knows the model: token ids are range-checked by the service.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from node.api.fields import (CHAT_ROLES, DEFAULT_CHAT_MAX_TOKENS, DEFAULT_COMPLETION_MAX_TOKENS, MAX_CHOICES,
                             MAX_CONCLAVE, MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_PROMPTS, MAX_STOP_LENGTH,
                             MAX_STOP_STRINGS, MAX_TOKENS_LIMIT, MAX_TOP_LOGPROBS, MIN_REPEAT_PENALTY,
                             UNSUPPORTED_FIELDS, Fields, type_name)
from node.api.output_schemas import parse_output, parse_tool_calls
from node.engine.types import SamplingParams
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import ChatMessage, ChatRequest, CompletionRequest, GenerationOptions, Output, ToolCall


def refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key, feature in UNSUPPORTED_FIELDS.items():
        value = body.get(key)
        if value is None or value == []:
            continue
        raise UnsupportedFeature(f"{feature.capitalize()} ('{key}') is not supported by this server", param=key)


def parse_stop(fields: Fields, key: str = "stop") -> tuple[str, ...]:
    value = fields.body.get(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise fields.fail(key, "must be a string or an array of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise fields.fail(key, f"may hold at most {MAX_STOP_STRINGS} strings")
    if any(not item or len(item) > MAX_STOP_LENGTH for item in items):
        raise fields.fail(key, f"strings must be 1 to {MAX_STOP_LENGTH} characters long")
    return tuple(dict.fromkeys(items))


def parse_logit_bias(fields: Fields) -> dict[int, float]:
    value = fields.body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fields.fail("logit_bias", f"must be an object mapping token ids to numbers, got {type_name(value)}")
    if len(value) > MAX_LOGIT_BIAS:
        raise fields.fail("logit_bias", f"may hold at most {MAX_LOGIT_BIAS} entries")
    bias: dict[int, float] = {}
    for token, amount in value.items():
        if not (token.isascii() and token.isdigit()):
            raise fields.fail("logit_bias", f"keys must be token ids, got {token!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not -100 <= amount <= 100:
            raise fields.fail("logit_bias", f"values must be numbers between -100 and 100, got {amount!r}")
        bias[int(token)] = float(amount)
    return bias


def parse_sampling(fields: Fields) -> SamplingParams:
    base = SamplingParams()
    return SamplingParams(
        temperature=fields.number("temperature", base.temperature, 0.0, 2.0),
        top_k=fields.integer("top_k", base.top_k, 0, 1_000_000),
        top_p=fields.number("top_p", base.top_p, 0.0, 1.0, above_lo=True),
        min_p=fields.number("min_p", base.min_p, 0.0, 1.0),
        repeat_penalty=fields.number("repeat_penalty", base.repeat_penalty, MIN_REPEAT_PENALTY, 10.0),
        repeat_last_n=fields.integer("repeat_last_n", base.repeat_last_n, -1, MAX_TOKENS_LIMIT),
        presence_penalty=fields.number("presence_penalty", base.presence_penalty, -2.0, 2.0),
        frequency_penalty=fields.number("frequency_penalty", base.frequency_penalty, -2.0, 2.0),
        logit_bias=parse_logit_bias(fields),
        seed=parse_seed(fields),
    )


def parse_seed(fields: Fields) -> int | None:
    """A seed in 0..2**64-1; -1 asks for a fresh random one, as llama.cpp's server takes it."""
    seed = fields.integer("seed", None, -1, 2**64 - 1)
    return None if seed == -1 else seed


def parse_options(fields: Fields, *, default_max_tokens: int, logprobs: int | None,
                  chat: bool = False) -> GenerationOptions:
    max_tokens = fields.integer("max_completion_tokens", None, 1, MAX_TOKENS_LIMIT)
    if max_tokens is None:
        max_tokens = fields.integer("max_tokens", default_max_tokens, 1, MAX_TOKENS_LIMIT)
    stream = fields.boolean("stream", False)
    include_usage = False
    if fields.present("stream_options"):
        if not stream:
            raise fields.fail("stream_options", "is only allowed when 'stream' is true")
        include_usage = Fields(fields.body["stream_options"], "stream_options").boolean("include_usage", False)
    n = fields.integer("n", 1, 1, MAX_CHOICES)
    best_of = fields.integer("best_of", None, 1, MAX_CHOICES)
    if best_of is not None and best_of < n:
        raise fields.fail("best_of", f"must be at least 'n' ({n}): the n best of best_of candidates are returned")
    conclave = fields.integer("conclave", 1, 1, MAX_CONCLAVE)
    if conclave > 1 and n > 1:
        raise fields.fail("conclave", "returns one voted answer: it needs 'n' = 1")
    if conclave > 1 and best_of is not None and best_of > 1:
        raise fields.fail("conclave", "and 'best_of' choose among candidates in different ways: send one of them")
    grammar, output = parse_output(fields, chat=chat)
    return GenerationOptions(
        max_tokens=max_tokens, sampling=dataclasses.replace(parse_sampling(fields), grammar=grammar),
        stop=parse_stop(fields), n=n, logprobs=logprobs, stream=stream, include_usage=include_usage,
        speculation=fields.boolean("speculation", True), output=output, conclave=conclave, best_of=best_of or n,
    )


def parse_prompts(fields: Fields) -> tuple[str | tuple[int, ...], ...]:
    value = fields.body.get("prompt")
    if value is None:
        raise fields.fail("prompt", "is required")
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not value:
        raise fields.fail("prompt", "must be a string, an array of strings or an array of token ids")
    if all(is_token(item) for item in value):
        return (tuple(value),)
    if len(value) > MAX_PROMPTS:
        raise fields.fail("prompt", f"may hold at most {MAX_PROMPTS} prompts")
    prompts: list[str | tuple[int, ...]] = []
    for item in value:
        if isinstance(item, str):
            prompts.append(item)
        elif isinstance(item, list) and item and all(is_token(token) for token in item):
            prompts.append(tuple(item))
        else:
            raise fields.fail("prompt", "items must be strings or non-empty arrays of token ids")
    return tuple(prompts)


def is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_completion(body: Any) -> CompletionRequest:
    fields = Fields(body)
    refuse_unsupported(fields.body)
    logprobs = fields.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
    echo = fields.boolean("echo", False)
    if echo and logprobs is not None:
        raise UnsupportedFeature("'echo' together with 'logprobs' (prompt scoring) is not supported", param="echo")
    return CompletionRequest(
        model=fields.string("model"),
        prompts=parse_prompts(fields),
        echo=echo,
        options=parse_options(fields, default_max_tokens=DEFAULT_COMPLETION_MAX_TOKENS, logprobs=logprobs),
    )


def parse_content(value: Any, param: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """Message content: a string, or an array of text parts (of the types in `kinds`) joined in order."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be a string or an array of content parts, got {type_name(value)}",
                             param=param, code="invalid_value")
    texts = []
    for index, part in enumerate(value):
        part_fields = Fields(part, f"{param}[{index}]")
        kind = part_fields.string("type")
        if kind not in kinds:
            raise UnsupportedFeature(f"Content parts of type {kind!r} are not supported here; only "
                                     f"{' and '.join(repr(k) for k in kinds)}", param=part_fields.name("type"))
        text = part_fields.string("text")
        if text is None:
            raise part_fields.fail("text", "is required")
        texts.append(text)
    return "".join(texts)


def parse_message(message: Fields, calls: dict[str, str]) -> ChatMessage:
    """One message; `calls` maps the ids of earlier messages' tool calls to their functions."""
    role = message.string("role")
    if role not in CHAT_ROLES:
        if role == "function":
            raise UnsupportedFeature("Messages with role 'function' (deprecated) are not supported; send the "
                                     "result as a message with role 'tool' and its 'tool_call_id'",
                                     param=message.name("role"))
        raise message.fail("role", f"must be one of {', '.join(CHAT_ROLES)}")
    if message.present("function_call") or message.present("audio"):
        raise UnsupportedFeature("'function_call' (deprecated; use 'tool_calls') and audio in messages are not "
                                 "supported", param=message.prefix)
    tool_calls: tuple[ToolCall, ...] = ()
    if message.present("tool_calls"):
        if role != "assistant":
            raise message.fail("tool_calls", "is only allowed on messages with role 'assistant'")
        tool_calls = parse_tool_calls(message)
    if message.body.get("content") is None:
        if not tool_calls:
            raise message.fail("content", "is required (a string or an array of text parts)")
        content = ""
    else:
        content = parse_content(message.body["content"], message.name("content"))
    if role == "tool":
        call_id = message.string("tool_call_id")
        if call_id is None:
            raise message.fail("tool_call_id", "is required: the id of the tool call this message answers")
        if call_id not in calls:
            raise message.fail("tool_call_id", f"{call_id!r} answers no tool call of an earlier assistant message")
        return ChatMessage("tool", content, tool_call_id=call_id, name=calls[call_id])
    for call in tool_calls:
        if call.id in calls:
            raise message.fail("tool_calls", f"repeats the tool call id {call.id!r}")
        calls[call.id] = call.name
    return ChatMessage(role="system" if role == "developer" else role, content=content, tool_calls=tool_calls)


def parse_messages(fields: Fields, earlier_calls: Mapping[str, str] | None = None) -> tuple[ChatMessage, ...]:
    """The messages; `earlier_calls`: ids of calls made before them (a session's history) and
    their functions, which tool messages may answer too."""
    value = fields.body.get("messages")
    if not isinstance(value, list) or not value:
        raise fields.fail("messages", "must be a non-empty array of messages")
    if len(value) > MAX_MESSAGES:
        raise fields.fail("messages", f"may hold at most {MAX_MESSAGES} messages")
    calls = dict(earlier_calls or {})
    return tuple(parse_message(Fields(item, f"messages[{index}]"), calls) for index, item in enumerate(value))


def parse_chat(body: Any, earlier_calls: Mapping[str, str] | None = None) -> ChatRequest:
    fields = Fields(body)
    refuse_unsupported(fields.body)
    wants_logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wants_logprobs:
        raise fields.fail("top_logprobs", "requires 'logprobs' to be true")
    return ChatRequest(
        model=fields.string("model"),
        messages=parse_messages(fields, earlier_calls),
        options=parse_options(fields, default_max_tokens=DEFAULT_CHAT_MAX_TOKENS,
                              logprobs=(top or 0) if wants_logprobs else None, chat=True),
    )
