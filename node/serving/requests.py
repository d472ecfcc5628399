"""The requests the service answers: frozen dataclasses, already validated by their parser.

The API parses OpenAI bodies into these (node/api/schemas.py); the CLI, batch jobs or any
other front end may build them directly. `GenerationOptions` is what both endpoints share;
every field of it either changes the answer (and so the L1 key, node/serving/l1.py) or is
listed there as presentation only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from node.engine.types import SamplingParams

ToolChoice = Literal["auto", "required", "function"]


@dataclass(frozen=True, slots=True)
class Tool:
    """One function a chat request offers the model (OpenAI's `tools[i].function`)."""

    name: str
    description: str
    parameters: str  # its JSON Schema as canonical JSON text

    def as_dict(self) -> dict[str, object]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(self.parameters)}}


@dataclass(frozen=True, slots=True)
class Output:
    """What the output is beyond free text (node/serving/structure.py): where its grammar came
    from, and the tools the model may call (`choice` "function" names one in `function`)."""

    param: str                         # the request field that asked for it ("response_format", "tools", ...)
    tools: tuple[Tool, ...] = ()
    choice: ToolChoice | None = None   # None: no tool calls, only the grammar of `param`
    function: str | None = None

    @property
    def forced_call(self) -> bool:
        return self.choice in ("required", "function")


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """What both endpoints share: how much to generate, how to sample, how to answer."""

    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    n: int
    logprobs: int | None  # None: off; k: the chosen token's logprob plus the top k
    stream: bool
    include_usage: bool
    speculation: bool = True  # False: plain decoding (same output; benchmarks' baseline)
    conclave: int = 1  # > 1: candidates of a Conclave, one answer by vote (node/serving/conclave/)
    best_of: int = 1   # > n: OpenAI's best_of, the n candidates with the highest mean logprob
    output: Output | None = None  # structured output or tool calls (the grammar is in `sampling`)

    @property
    def deterministic(self) -> bool:
        """Greedy decoding: the same prompt and options always give the same answer."""
        return self.sampling.greedy


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids used as they are
    echo: bool
    options: GenerationOptions


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of a function: made by the model in an answer, or sent back in an assistant message."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_dict(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message; an assistant message may carry `tool_calls`, a "tool" message answers one
    of them (`tool_call_id`, `name`: the function it called)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (Hugging Face's convention: a call's
        `function.arguments` is the parsed object, a tool result has role "tool")."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": json.loads(call.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
            message["name"] = self.name
        return message


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str | None
    messages: tuple[ChatMessage, ...]
    options: GenerationOptions
