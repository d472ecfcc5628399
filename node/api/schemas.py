"""OpenAI request bodies, type-checked field by field into the serving layer's frozen requests.

Every field is checked for its JSON type and range; a failure is an `InvalidRequest` naming
the field (`param`). Real OpenAI features this node does not offer (images, audio, ...) are
refused with `UnsupportedFeature` instead of being ignored. Structured output (`response_format`,
`grammar`, `json_schema`, `format`) and tools are read by `parse_output` into a grammar
(node/serving/structure.py checks schemas and grammars) and an `Output`.
Unknown fields that do not change the output (`user`, `metadata`, `store`, ...) are ignored.
Chat messages may carry the tool-calling loop: assistant messages with `tool_calls`, and "tool"
messages answering one of them by `tool_call_id` (an id of an earlier message's call).
Nothing here knows the model: token ids are range-checked by the service.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, overload

from node.engine.types import GrammarSpec, SamplingParams
from node.serving import structure
from node.serving.tools import tool_call_schema
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import (ChatMessage, ChatRequest, CompletionRequest, GenerationOptions, Output, Tool,
                                   ToolCall)

MAX_PROMPTS = 16
MAX_CHOICES = 16
MAX_CONCLAVE = 16  # candidates of a Conclave; a node may allow fewer ([conclave] max_candidates)
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_MESSAGES = 4096
MAX_LOGIT_BIAS = 1024
MAX_TOP_LOGPROBS = 20
MAX_TOKENS_LIMIT = 1_000_000
MIN_REPEAT_PENALTY = 0.01  # logits are divided by it: smaller values overflow them
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 512  # the CLI's default; the context may clip it further

MAX_TOOLS = 128
MAX_TOOL_CALLS = 128  # per assistant message
MAX_CALL_ID = 256
MAX_ARGUMENT_NESTING = 64  # a call's arguments are rendered (and re-encoded) with the prompt
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # function and schema names
UNSUPPORTED_FIELDS = {
    "functions": "function calling (the deprecated 'functions'; use 'tools')",
    "function_call": "function calling (the deprecated 'function_call'; use 'tool_choice')",
    "audio": "audio output",
    "modalities": "output modalities other than text",
    "prediction": "predicted outputs",
    "suffix": "insertion (suffix)",
    "web_search_options": "web search",
}
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class Fields:
    """Typed access to one JSON object; every error names the field it is about."""

    def __init__(self, body: Any, prefix: str = "") -> None:
        if not isinstance(body, dict):
            raise InvalidRequest(f"{prefix or 'The request body'} must be a JSON object", param=prefix or None)
        self.body: Mapping[str, Any] = body
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, message: str) -> InvalidRequest:
        return InvalidRequest(f"'{self.name(key)}' {message}", param=self.name(key), code="invalid_value")

    def present(self, key: str) -> bool:
        return self.body.get(key) is not None

    @overload
    def integer(self, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int: ...

    @overload
    def integer(self, key: str, default: None, lo: int | None = None, hi: int | None = None) -> int | None: ...

    def integer(self, key: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.fail(key, f"must be an integer, got {type_name(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return value

    def number(self, key: str, default: float, lo: float, hi: float, *, above_lo: bool = False) -> float:
        """A number in [lo, hi], or in (lo, hi] with `above_lo`."""
        value = self.body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {type_name(value)}")
        if above_lo and not lo < value <= hi:
            raise self.fail(key, f"must be above {lo} and at most {hi}, got {value}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be a boolean, got {type_name(value)}")
        return value

    def string(self, key: str) -> str | None:
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {type_name(value)}")
        return value


def type_name(value: Any) -> str:
    return {
        bool: "a boolean", int: "an integer", float: "a number", str: "a string",
        list: "an array", dict: "an object", type(None): "null",
    }.get(type(value), type(value).__name__)


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


def parse_response_format(fields: Fields) -> GrammarSpec | None:
    value = fields.body.get("response_format")
    if value is None:
        return None
    rf = Fields(value, "response_format")
    return format_spec(rf, lambda: Fields(rf.body.get("json_schema"), "response_format.json_schema"))


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
        name = inner.string("name")
        if name is not None and not TOOL_NAME.fullmatch(name):
            raise inner.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
        inner.boolean("strict", False)
        inner.string("description")
        if "schema" not in inner.body:
            raise inner.fail("schema", "is required")
        return structure.schema_spec(inner.body["schema"], inner.name("schema"))
    raise rf.fail("type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")


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
