"""OpenAI request bodies, type-checked field by field into the serving layer's frozen requests.

Every field is checked for its JSON type and range; a failure is an `InvalidRequest` naming
the field (`param`). Real OpenAI features this node does not offer (tools, images, audio,
structured output, ...) are refused with `UnsupportedFeature` instead of being ignored.
Unknown fields that do not change the output (`user`, `metadata`, `store`, ...) are ignored.
Nothing here knows the model: token ids are range-checked by the service.
"""

from __future__ import annotations

from typing import Any, Mapping, overload

from node.engine.types import SamplingParams
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import ChatMessage, ChatRequest, CompletionRequest, GenerationOptions

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

UNSUPPORTED_FIELDS = {
    "tools": "tool calling",
    "tool_choice": "tool calling",
    "functions": "function calling",
    "function_call": "function calling",
    "parallel_tool_calls": "tool calling",
    "response_format": "structured output (response_format)",
    "audio": "audio output",
    "modalities": "output modalities other than text",
    "prediction": "predicted outputs",
    "suffix": "insertion (suffix)",
    "web_search_options": "web search",
}
CHAT_ROLES = ("system", "developer", "user", "assistant")


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
        if value is None or value == [] or (key == "response_format" and value == {"type": "text"}):
            continue
        raise UnsupportedFeature(f"{feature.capitalize()} ('{key}') is not supported by this server", param=key)


def parse_stop(fields: Fields) -> tuple[str, ...]:
    value = fields.body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise fields.fail("stop", "must be a string or an array of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise fields.fail("stop", f"may hold at most {MAX_STOP_STRINGS} strings")
    if any(not item or len(item) > MAX_STOP_LENGTH for item in items):
        raise fields.fail("stop", f"strings must be 1 to {MAX_STOP_LENGTH} characters long")
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
        presence_penalty=fields.number("presence_penalty", base.presence_penalty, -2.0, 2.0),
        frequency_penalty=fields.number("frequency_penalty", base.frequency_penalty, -2.0, 2.0),
        logit_bias=parse_logit_bias(fields),
        seed=parse_seed(fields),
    )


def parse_seed(fields: Fields) -> int | None:
    """A seed in 0..2**64-1; -1 asks for a fresh random one, as llama.cpp's server takes it."""
    seed = fields.integer("seed", None, -1, 2**64 - 1)
    return None if seed == -1 else seed


def parse_options(fields: Fields, *, default_max_tokens: int, logprobs: int | None) -> GenerationOptions:
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
    return GenerationOptions(
        max_tokens=max_tokens, sampling=parse_sampling(fields), stop=parse_stop(fields), n=n,
        logprobs=logprobs, stream=stream, include_usage=include_usage,
        speculation=fields.boolean("speculation", True), conclave=conclave, best_of=best_of or n,
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


def parse_content(value: Any, param: str) -> str:
    """Message content: a string, or an array of text parts joined in order."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be a string or an array of content parts, got {type_name(value)}",
                             param=param, code="invalid_value")
    texts = []
    for index, part in enumerate(value):
        part_fields = Fields(part, f"{param}[{index}]")
        kind = part_fields.string("type")
        if kind != "text":
            raise UnsupportedFeature(f"Content parts of type {kind!r} are not supported; only 'text' is",
                                     param=part_fields.name("type"))
        text = part_fields.string("text")
        if text is None:
            raise part_fields.fail("text", "is required")
        texts.append(text)
    return "".join(texts)


def parse_messages(fields: Fields) -> tuple[ChatMessage, ...]:
    value = fields.body.get("messages")
    if not isinstance(value, list) or not value:
        raise fields.fail("messages", "must be a non-empty array of messages")
    if len(value) > MAX_MESSAGES:
        raise fields.fail("messages", f"may hold at most {MAX_MESSAGES} messages")
    messages = []
    for index, item in enumerate(value):
        message = Fields(item, f"messages[{index}]")
        role = message.string("role")
        if role not in CHAT_ROLES:
            if role in ("tool", "function"):
                raise UnsupportedFeature(f"Messages with role {role!r} (tool calling) are not supported",
                                         param=message.name("role"))
            raise message.fail("role", f"must be one of {', '.join(CHAT_ROLES)}")
        if message.present("tool_calls") or message.present("function_call") or message.present("audio"):
            raise UnsupportedFeature("Tool calls and audio in messages are not supported", param=message.prefix)
        if "content" not in message.body or message.body["content"] is None:
            raise message.fail("content", "is required (a string or an array of text parts)")
        messages.append(ChatMessage(role="system" if role == "developer" else role,
                                    content=parse_content(message.body["content"], message.name("content"))))
    return tuple(messages)


def parse_chat(body: Any) -> ChatRequest:
    fields = Fields(body)
    refuse_unsupported(fields.body)
    wants_logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wants_logprobs:
        raise fields.fail("top_logprobs", "requires 'logprobs' to be true")
    return ChatRequest(
        model=fields.string("model"),
        messages=parse_messages(fields),
        options=parse_options(fields, default_max_tokens=DEFAULT_CHAT_MAX_TOKENS,
                              logprobs=(top or 0) if wants_logprobs else None),
    )
