"""Ollama's request bodies, checked field by field into the serving layer's requests.

`/api/chat` becomes a `ChatRequest`, `/api/generate` an `OllamaGenerate` (the route renders it
through the chat template, or uses it raw), `/api/embed` and `/api/embeddings` a list of texts.
The pieces OpenAI's parser has are its own (node/api/schemas.py): `Fields`, the sampling fields,
`stop`, `format` ("json" or a JSON Schema) and `tools` (the same objects in both APIs). What is
Ollama's own is here:

- `options`: the sampling keys (`temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`,
  `repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`), `num_predict`
  (-1 and -2: until the context is full) and `num_ctx` (the request's context window: at most
  the node's). Sampling options Ollama has and the node does not are accepted at their neutral
  value (`typical_p` 1, `tfs_z` 1, `mirostat` 0) and a 400 otherwise; Ollama's load-time
  options (`num_gpu`, `num_thread`, ...) are a 400 (the node loads its model once, with its own
  settings); any other key is a 400 naming it.
- messages: Ollama's tool calls carry no ids and their `arguments` are objects; a call gets an id
  here, and a "tool" message answers the first unanswered call of its `tool_name` (or the first
  unanswered call when it names none). `images` are a 400 (the served model reads text only).
- `keep_alive` is checked (a duration such as "5m" or a number of seconds) and has no effect:
  the node keeps its model loaded for as long as it runs. `think` other than false is a 400.
- a model name may carry Ollama's `:latest` tag.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from node.api.fields import (DEFAULT_CHAT_MAX_TOKENS, MAX_ARGUMENT_NESTING, MAX_MESSAGES, MAX_TOKENS_LIMIT,
                             MAX_TOP_LOGPROBS, TOOL_NAME, Fields, type_name)
from node.api.output_schemas import nesting, parse_output, tool_call_items
from node.api.schemas import is_token, parse_sampling, parse_stop
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import ChatMessage, ChatRequest, GenerationOptions, ToolCall
from node.serving.structure import canonical_json

LATEST = ":latest"
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty", "repeat_last_n",
                    "presence_penalty", "frequency_penalty")
WINDOW_OPTIONS = ("num_predict", "num_ctx")
NEUTRAL_OPTIONS: Mapping[str, float] = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
LOAD_OPTIONS = ("num_keep", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "penalize_newline")
FILL_CONTEXT = (-1, -2)  # num_predict: generate until the context is full
ROLES = ("system", "user", "assistant", "tool")
DURATION = re.compile(r"-?(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+|-?\d+(\.\d*)?")
MAX_CONTEXT_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class Window:
    """How long the answer may be: `max_tokens` None means until the window is full."""

    max_tokens: int | None
    num_ctx: int | None  # None: the node's context


@dataclass(frozen=True, slots=True)
class OllamaGenerate:
    model: str | None
    prompt: str
    system: str | None
    raw: bool
    context: tuple[int, ...] | None  # token ids of an earlier answer's `context`, continued
    options: GenerationOptions


def model_name(fields: Fields) -> str | None:
    """The `model` field without Ollama's `:latest` tag."""
    name = fields.string("model")
    if name is not None and name.lower().endswith(LATEST):
        name = name[: -len(LATEST)]
    return name


def body_fields(body: Any) -> Fields:
    """The body's fields, after the checks every generation route shares (`keep_alive`, `think`)."""
    fields = Fields(body)
    parse_keep_alive(fields)
    think = fields.body.get("think")
    if think not in (None, False):
        raise UnsupportedFeature("Thinking ('think') is not supported: the served model does not think "
                                 "before it answers", param="think")
    return fields


def parse_keep_alive(fields: Fields) -> None:
    """Checked, without effect: the node keeps its model loaded while it runs."""
    value = fields.body.get("keep_alive")
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return
    if not isinstance(value, str) or not DURATION.fullmatch(value):
        raise fields.fail("keep_alive", "must be a duration such as \"5m\" or \"1h\", or a number of seconds")


def option_fields(fields: Fields) -> Fields:
    """The `options` object, every key known: unknown, load-time and non-neutral keys are 400s."""
    options = Fields(fields.body.get("options") or {}, "options")
    for key, value in options.body.items():
        if value is None or key in SAMPLING_OPTIONS or key in WINDOW_OPTIONS or key == "stop":
            continue
        if key in NEUTRAL_OPTIONS:
            if isinstance(value, bool) or value != NEUTRAL_OPTIONS[key]:  # true == 1 in Python, not in JSON
                raise UnsupportedFeature(f"'{options.name(key)}' is not supported by this node's sampler; only "
                                         f"its neutral value {NEUTRAL_OPTIONS[key]} is accepted",
                                         param=options.name(key))
        elif key in LOAD_OPTIONS:
            raise UnsupportedFeature(f"'{options.name(key)}' is a load-time setting: this node loads its model once "
                                     "at start with its own settings, not per request", param=options.name(key))
        else:
            raise InvalidRequest(f"'{options.name(key)}' is not an option this node knows; it takes "
                                 f"{', '.join((*SAMPLING_OPTIONS, 'stop', *WINDOW_OPTIONS))}",
                                 param=options.name(key), code="unknown_option")
    return options


def num_predict(options: Fields) -> int | None:
    """`num_predict`: positive, or -1 / -2 (until the context is full); None when absent."""
    predict = options.integer("num_predict", None, -2, MAX_TOKENS_LIMIT)
    if predict == 0:
        raise options.fail("num_predict", "must be positive, or -1 / -2 for until the context is full")
    return predict


def parse_window(body: Any, n_ctx: int) -> Window:
    """`num_predict` and `num_ctx`; a num_ctx over the node's context is a 400."""
    options = option_fields(Fields(body))
    num_ctx = options.integer("num_ctx", None, 1, MAX_CONTEXT_TOKENS)
    if num_ctx is not None and num_ctx > n_ctx:
        raise options.fail("num_ctx", f"is {num_ctx}, over this node's context of {n_ctx} tokens "
                                      "([model] context_length); ask for at most that")
    predict = num_predict(options)
    if predict in FILL_CONTEXT:
        return Window(None, num_ctx)
    return Window(predict or DEFAULT_CHAT_MAX_TOKENS, num_ctx)


def parse_generation(fields: Fields, *, chat: bool) -> GenerationOptions:
    options = option_fields(fields)
    predict = num_predict(options)
    top = fields.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    logprobs = top if fields.boolean("logprobs", False) else None
    asked = ("format", "tools") if chat else ("format",)  # /api/generate has no tools
    grammar, output = parse_output(Fields({key: fields.body.get(key) for key in asked}), chat=chat)
    return GenerationOptions(
        max_tokens=predict if predict is not None and predict > 0 else DEFAULT_CHAT_MAX_TOKENS,
        sampling=dataclasses.replace(parse_sampling(options), grammar=grammar),
        stop=parse_stop(options), n=1, logprobs=logprobs, stream=fields.boolean("stream", True),
        include_usage=False, output=output,
    )


def refuse_images(fields: Fields) -> None:
    if fields.body.get("images"):
        raise UnsupportedFeature(f"Images ('{fields.name('images')}') are not supported: the served model reads "
                                 "text only", param=fields.name("images"))


def parse_calls(message: Fields, number: int) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` in Ollama's shape; each call gets an id."""
    calls = []
    for index, item in enumerate(tool_call_items(message)):
        function = Fields(Fields(item, message.name(f"tool_calls[{index}]")).body.get("function"),
                          message.name(f"tool_calls[{index}].function"))
        name = function.string("name")
        if name is None or not TOOL_NAME.fullmatch(name):
            raise function.fail("name", "must be 1 to 64 letters, digits, underscores or dashes")
        arguments = function.body.get("arguments", {})
        if not isinstance(arguments, dict):
            raise function.fail("arguments", f"must be an object (the call's arguments), got {type_name(arguments)}")
        if nesting(arguments) > MAX_ARGUMENT_NESTING:
            raise function.fail("arguments", f"may nest objects and arrays at most {MAX_ARGUMENT_NESTING} deep")
        calls.append(ToolCall(f"call_{number}_{index}", name, canonical_json(arguments)))
    return tuple(calls)


def parse_message(message: Fields, number: int, pending: list[ToolCall]) -> ChatMessage:
    """One message; `pending`: earlier calls no tool message has answered yet (in order)."""
    role = message.string("role")
    if role not in ROLES:
        raise message.fail("role", f"must be one of {', '.join(ROLES)}")
    refuse_images(message)
    content = message.string("content") or ""
    message.string("thinking")  # an earlier answer's thinking: not rendered
    if message.present("tool_calls"):
        if role != "assistant":
            raise message.fail("tool_calls", "is only allowed on messages with role 'assistant'")
        calls = parse_calls(message, number)
        pending.extend(calls)
        return ChatMessage("assistant", content, tool_calls=calls)
    if role == "tool":
        wanted = message.string("tool_name")
        call = next((call for call in pending if wanted is None or call.name == wanted), None)
        if call is None:
            which = f"a call of {wanted!r}" if wanted else "a tool call"
            raise message.fail("role", f"is 'tool', but no earlier assistant message made {which} still unanswered")
        pending.remove(call)
        return ChatMessage("tool", content, tool_call_id=call.id, name=call.name)
    return ChatMessage(role, content)


def parse_load(body: Any, n_ctx: int) -> str | None:
    """A chat with no messages (Ollama's way to load a model), every other field checked: its model."""
    fields = body_fields(body)
    parse_window(body, n_ctx)
    parse_generation(fields, chat=True)
    return model_name(fields)


def parse_chat(body: Any, earlier_calls: Mapping[str, str] | None = None) -> ChatRequest:
    """`/api/chat`; `earlier_calls`: a session's calls (id -> function), which tool messages may answer."""
    fields = body_fields(body)
    value = fields.body.get("messages")
    if not isinstance(value, list) or not value:
        raise fields.fail("messages", "must be a non-empty array of messages")
    if len(value) > MAX_MESSAGES:
        raise fields.fail("messages", f"may hold at most {MAX_MESSAGES} messages")
    pending = [ToolCall(call_id, name, "{}") for call_id, name in (earlier_calls or {}).items()]
    messages = tuple(parse_message(Fields(item, f"messages[{index}]"), index, pending)
                     for index, item in enumerate(value))
    return ChatRequest(model=model_name(fields), messages=messages, options=parse_generation(fields, chat=True))


def parse_generate(body: Any) -> OllamaGenerate:
    fields = body_fields(body)
    refuse_images(fields)
    if fields.body.get("tools"):
        raise UnsupportedFeature("'tools' are a chat feature: send them to /api/chat", param="tools")
    for key, feature in (("template", "a prompt template per request"), ("suffix", "insertion (suffix)")):
        if fields.body.get(key):
            raise UnsupportedFeature(f"{feature.capitalize()} ('{key}') is not supported by this node", param=key)
    context = fields.body.get("context")
    if context is not None:
        if not isinstance(context, list) or not all(is_token(token) for token in context):
            raise fields.fail("context", "must be an array of token ids (an earlier answer's 'context')")
        if len(context) > MAX_CONTEXT_TOKENS:
            raise fields.fail("context", f"may hold at most {MAX_CONTEXT_TOKENS} tokens")
    return OllamaGenerate(
        model=model_name(fields), prompt=fields.string("prompt") or "", system=fields.string("system"),
        raw=fields.boolean("raw", False), context=tuple(context) if context else None,
        options=parse_generation(fields, chat=False),
    )


def parse_embed(body: Any, *, key: str) -> tuple[str | None, list[str], int | None]:
    """`/api/embed` (`input`: a string or strings) or `/api/embeddings` (`prompt`: one string):
    the model, the texts and `dimensions` (None: the model's width)."""
    fields = Fields(body)
    parse_keep_alive(fields)
    options = option_fields(fields)  # checked as /api/generate checks them, though embeddings sample nothing
    num_predict(options)
    options.integer("num_ctx", None, 1, MAX_CONTEXT_TOKENS)
    parse_sampling(options)
    parse_stop(options)
    fields.boolean("truncate", True)
    dimensions = fields.integer("dimensions", None, 1, MAX_TOKENS_LIMIT)
    value = fields.body.get(key)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise fields.fail(key, "must be a string" + (" or a non-empty array of strings" if key == "input" else ""))
    return model_name(fields), texts, dimensions


def parse_model(body: Any) -> str | None:
    """`/api/show`: `model` (or the older `name`)."""
    fields = Fields(body)
    fields.boolean("verbose", False)
    name = model_name(fields)
    if name is None:
        name = model_name(Fields({"model": fields.body.get("name")}))
    if name is None:
        raise fields.fail("model", "is required")
    return name
