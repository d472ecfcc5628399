"""Chat templates: turn a list of chat messages into the prompt text a model was trained on.

The GGUF's own template (`tokenizer.chat_template`) wins; it is run in a sandboxed, immutable
jinja2 environment. A GGUF without one (the offline Gemma 3 270M base model among them) gets a
built-in template chosen by architecture or by the catalog's family. Tool calls and results in
the messages reach a template that renders tools as they are, any other as plain turns
(node/models/tool_turns.py). Rendered text never starts
with the BOS token: the tokenizer adds it (`add_bos=True`), and control tokens in the text are
tokenized as special tokens (`special=True`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from node.engine.config import EngineConfig
from node.engine.types import ModelInfo
from node.models.tool_turns import native_tool_markers, plain_tool_turns


class TemplateError(ValueError):
    """Messages the template cannot render (bad roles, non-text content, template errors)."""


_GEMMA = """\
{%- if messages[0]['role'] == 'system' -%}
  {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('Gemma needs roles to alternate user/assistant/user/...') }}
  {%- endif -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}
  {{- message['content'] | trim }}<end_of_turn>
{{ '' }}
{%- endfor -%}
{%- if add_generation_prompt -%}<start_of_turn>model
{{ '' }}
{%- endif -%}
"""

_CHATML = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{{ '' }}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant
{{ '' }}
{%- endif -%}
"""

_LLAMA2 = """\
{%- if messages[0]['role'] == 'system' -%}
  {%- set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set system = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('Llama 2 needs roles to alternate user/assistant/user/...') }}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {{ ('' if loop.first else bos_token) + '[INST] ' + (system if loop.first else '')
       + message['content'] | trim + ' [/INST]' }}
  {%- else -%}
    {{ ' ' + message['content'] | trim + ' ' + eos_token }}
  {%- endif -%}
{%- endfor -%}
"""

_LLAMA3 = """\
{%- for message in messages -%}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>

{{ '' }}
{%- endif -%}
"""

_ZEPHYR = """\
{%- for message in messages -%}
<|{{ message['role'] }}|>
{{ message['content'] }}{{ eos_token }}
{{ '' }}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>
{{ '' }}
{%- endif -%}
"""

_TULU = """\
{%- for message in messages -%}
<|{{ message['role'] }}|>
{{ message['content'] }}{{ eos_token if message['role'] == 'assistant' else '' }}
{{ '' }}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>
{{ '' }}
{%- endif -%}
"""


@dataclass(frozen=True, slots=True)
class BuiltinTemplate:
    source: str
    stop_strings: tuple[str, ...]
    bos_token: str = ""
    eos_token: str = ""


BUILTIN: Mapping[str, BuiltinTemplate] = {
    "gemma": BuiltinTemplate(_GEMMA, ("<end_of_turn>",), "<bos>", "<eos>"),
    "chatml": BuiltinTemplate(_CHATML, ("<|im_end|>",), "", "<|im_end|>"),
    "llama2": BuiltinTemplate(_LLAMA2, ("</s>",), "<s>", "</s>"),
    "llama3": BuiltinTemplate(_LLAMA3, ("<|eot_id|>",), "<|begin_of_text|>", "<|eot_id|>"),
    "zephyr": BuiltinTemplate(_ZEPHYR, ("</s>", "<|user|>"), "<s>", "</s>"),
    "tulu": BuiltinTemplate(_TULU, ("<|endoftext|>", "<|user|>"), "", "<|endoftext|>"),
}

# GGUF `general.architecture` -> built-in family, for models that carry no template.
ARCHITECTURE_FAMILY: Mapping[str, str] = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "qwen": "chatml", "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml",
    "qwen3moe": "chatml", "phi3": "chatml", "smollm3": "chatml",
    "olmoe": "tulu", "olmo": "tulu", "olmo2": "tulu",
}
LLAMA3_MIN_VOCAB = 100_000  # Llama 3's vocabulary is 128,256; Llama 2's 32,000


def family_for(architecture: str | None, n_vocab: int = 0) -> str:
    arch = (architecture or "").lower()
    if arch in ARCHITECTURE_FAMILY:
        return ARCHITECTURE_FAMILY[arch]
    if arch == "llama":
        return "llama3" if n_vocab >= LLAMA3_MIN_VOCAB else "llama2"
    return "chatml"


def _piece(token_text: Callable[[int], bytes] | None, token: int | None) -> str:
    if token_text is None or token is None:
        return ""
    return token_text(token).decode("utf-8", "replace")


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


def flatten_content(content: Any, index: int) -> str:
    """A message's content as one string: text parts of a content array are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping):
                raise TemplateError(f"messages[{index}].content: each part must be an object")
            kind = part.get("type")
            if kind != "text":
                raise TemplateError(
                    f"messages[{index}].content: part type {kind!r} is not supported; "
                    "this model reads text only"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise TemplateError(f"messages[{index}].content: a text part needs a string 'text'")
            texts.append(text)
        return "".join(texts)
    raise TemplateError(f"messages[{index}].content must be a string or an array of text parts")


def normalize_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(f"messages[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError(f"messages[{index}].role must be a non-empty string")
        normalized = dict(message)
        normalized["content"] = flatten_content(message.get("content"), index)
        out.append(normalized)
    if not out:
        raise TemplateError("messages must not be empty")
    return out


class TemplateSource(Protocol):
    """What choosing a running engine's template reads (the engine, or the serving layer's client)."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def model_info(self) -> ModelInfo: ...

    def token_piece(self, token: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled chat template with the tokens it needs and the text that ends a turn."""

    name: str
    source: str
    stop_strings: tuple[str, ...]
    bos_token: str = ""
    eos_token: str = ""
    _compiled: jinja2.Template = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        try:
            compiled = _environment().from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template {self.name} does not compile: {exc}") from None
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def builtin(cls, family: str) -> "ChatTemplate":
        try:
            spec = BUILTIN[family]
        except KeyError:
            raise TemplateError(
                f"no built-in chat template {family!r} (known: {', '.join(BUILTIN)})"
            ) from None
        return cls(f"builtin:{family}", spec.source, spec.stop_strings, spec.bos_token, spec.eos_token)

    @classmethod
    def from_gguf(cls, source: str, *, bos_token: str = "", eos_token: str = "") -> "ChatTemplate":
        digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
        stops = tuple(s for s in (eos_token,) if s)
        for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
            if marker in source and marker not in stops:
                stops += (marker,)
        return cls(f"gguf:{digest}", source, stops, bos_token, eos_token)

    @classmethod
    def for_model(cls, model_info: Any, *, family: str | None = None,
                  token_text: Callable[[int], bytes] | None = None) -> "ChatTemplate":
        """The model's own template if it has one, else the built-in one for its family.

        `model_info` is the engine's ModelInfo. GGUF templates that print `bos_token` or
        `eos_token` need their text: `token_text` (e.g. `engine.token_piece`) turns the
        model's bos/eos ids into it; `bos_text`/`eos_text` attributes are used when present.
        """
        bos = getattr(model_info, "bos_text", None) or _piece(token_text, getattr(model_info, "bos", None))
        eos = getattr(model_info, "eos_text", None) or _piece(token_text, getattr(model_info, "eos", None))
        source = getattr(model_info, "chat_template", None)
        if source:
            return cls.from_gguf(source, bos_token=bos, eos_token=eos)
        chosen = family or family_for(
            getattr(model_info, "architecture", None), getattr(model_info, "n_vocab", 0) or 0
        )
        return cls.builtin(chosen)

    @classmethod
    def for_engine(cls, engine: TemplateSource) -> "ChatTemplate":
        """The template for a running engine: its GGUF's own, else its catalog family's."""
        from node.models.catalog import entry_for_file

        entry = entry_for_file(Path(engine.config.model_path))
        return cls.for_model(engine.model_info, family=entry.template if entry else None,
                             token_text=engine.token_piece)

    @property
    def renders_tools(self) -> bool:
        """The template renders `tools`, tool calls and results itself (node/models/tool_turns.py)."""
        return native_tool_markers(self.source) is not None

    def render(self, messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True,
               **extra: Any) -> str:
        normalized = normalize_messages(messages)
        if not self.renders_tools:
            normalized = plain_tool_turns(normalized)
        try:
            text = self._compiled.render(
                messages=normalized, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra,
            )
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise TemplateError(f"chat template {self.name} failed: {exc}") from None
        if self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]  # the tokenizer adds BOS itself
        return text
