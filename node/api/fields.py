"""Reading a JSON request body field by field, and the limits every API's parser holds it to.

`Fields` gives typed access to one JSON object; each failure is an `InvalidRequest` naming
the field (`param`). The limits (prompts, choices, stop strings, messages, tools, ...) are
the same for every API the node speaks (node/api/schemas.py, ollama_schemas.py,
anthropic_schemas.py, responses_schemas.py); node/api/openapi.py documents them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, overload

from node.serving.errors import InvalidRequest

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
