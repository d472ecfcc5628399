"""Tool calling in the serving layer: what a forced call must look like, what a model is told,
and reading calls back out of the generated text.

- Forced calls (`tool_choice` "required" or a named function): the output's grammar is
  `tool_call_schema` (`{"name": <function>, "arguments": <its parameters>}`, one object per
  allowed function, `anyOf`; node/serving/structure.py compiles it like any schema); a
  template that does not render tools is told what to call in the system message
  (`tool_prompt`, `with_system`).
- `tool_choice: "auto"` needs a chat template that renders tools and writes calls between
  markers the node can find (`ToolMarkers`: Qwen 2.5 / Hermes style
  `<tool_call>{...}</tool_call>`, node/models/tool_turns.py); `parse_marked_calls` reads them
  out of the generated text.
- `ToolCallReader` turns one choice's text into content and tool-call deltas as it streams
  (the API shapes them into OpenAI's `tool_calls`, node/api/shapes.py).

The request side (the `tools` and `tool_choice` fields) is parsed in node/api/schemas.py into
`Tool` and `Output` (node/serving/requests.py).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from node.models.tool_turns import native_tool_markers
from node.serving.requests import Output, Tool, ToolCall
from node.serving.structure import canonical_json


def tool_call_schema(tools: tuple[Tool, ...], function: str | None) -> dict[str, Any]:
    """The schema of one forced call: `{"name": ..., "arguments": ...}` per allowed function."""
    chosen = [tool for tool in tools if function is None or tool.name == function]
    options = [{"type": "object", "properties": {"name": {"const": tool.name},
                                                 "arguments": json.loads(tool.parameters)},
                "required": ["name", "arguments"], "additionalProperties": False} for tool in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_prompt(tools: tuple[Tool, ...], function: str | None) -> str:
    """What a template without tool support is told (as a system message) before a forced call."""
    chosen = [tool.as_dict()["function"] for tool in tools if function is None or tool.name == function]
    listing = "\n".join(canonical_json(item) for item in chosen)
    return f"Call one of these functions. Reply with a JSON object {{\"name\": ..., \"arguments\": ...}}.\n{listing}"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True, slots=True)
class ToolMarkers:
    """How a chat template writes a call: `open` + JSON {"name", "arguments"} + `close`."""

    open: str
    close: str

    @classmethod
    def of_template(cls, source: str) -> ToolMarkers | None:
        """Markers of a template that renders `tools` and writes calls the node can parse."""
        markers = native_tool_markers(source)
        return cls(*markers) if markers is not None else None


_CALL_BODY = re.compile(r"\s*(\{.*\})\s*", re.S)


def parse_marked_calls(text: str, markers: ToolMarkers) -> tuple[str, list[ToolCall]]:
    """The content before the first marker and every well-formed call after it.

    A call whose JSON does not parse, or lacks a string `name`, is left in the content as it
    was written (the client sees what the model said, nothing is dropped silently)."""
    first = text.find(markers.open)
    if first < 0:
        return text, []
    content, rest, calls, leftovers = text[:first], text[first:], [], []
    for chunk in rest.split(markers.open)[1:]:
        body, _, after = chunk.partition(markers.close)
        match = _CALL_BODY.fullmatch(body)
        call = None
        if match:
            try:
                value = json.loads(match.group(1))
            except ValueError:
                value = None
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                arguments = value.get("arguments", value.get("parameters", {}))
                call = ToolCall(new_call_id(), value["name"],
                                arguments if isinstance(arguments, str) else canonical_json(arguments))
        if call is None:
            leftovers.append(markers.open + chunk)
        else:
            calls.append(call)
            if after.strip():
                leftovers.append(after)
    return (content + "".join(leftovers)).strip() if calls else text, calls


# ---- reading an answer back -----------------------------------------------------------------

Piece = tuple[Literal["content"], str] | tuple[Literal["call"], int, dict[str, Any]]


class ToolCallReader:
    """Turns one choice's generated text into content and tool-call deltas, as it streams.

    Forced calls (`{"name": ..., "arguments": ...}` under the grammar, compact): the name is
    sent once it is complete, then the arguments as they are generated, the object's closing
    brace held back. `auto`: content streams until the template's call marker appears (a
    partial marker is held back); the calls after it are parsed when the choice ends.
    """

    def __init__(self, output: Output, markers: ToolMarkers | None, call_id: str | None = None) -> None:
        self.output = output
        self.markers = markers
        self.call_id = call_id         # the forced call's id (None: a new one)
        self.text = ""
        self._sent = 0                 # characters of `text` already turned into pieces
        self._call: ToolCall | None = None
        self._args_from = -1           # where the arguments start in `text` (forced calls)
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Piece]:
        self.text += text
        if self.output.forced_call:
            return self._feed_forced()
        return self._feed_auto()

    def _feed_forced(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._call is None:
            match = re.match(r'\{"name":("(?:[^"\\]|\\.)*"),"arguments":', self.text)
            if match is None:
                return pieces
            self._call = ToolCall(self.call_id or new_call_id(), json.loads(match.group(1)), "")
            self._args_from = self._sent = match.end()
            pieces.append(("call", 0, {"index": 0, "id": self._call.id, "type": "function",
                                       "function": {"name": self._call.name, "arguments": ""}}))
        end = len(self.text) - 1  # the outer object's closing brace may be the last character
        if end > self._sent:
            pieces.append(("call", 0, {"index": 0, "function": {"arguments": self.text[self._sent:end]}}))
            self._sent = end
        return pieces

    def _feed_auto(self) -> list[Piece]:
        assert self.markers is not None
        if self.text.find(self.markers.open) >= 0:
            return []
        keep = _partial_suffix(self.text, self.markers.open)
        end = len(self.text) - keep
        if end <= self._sent:
            return []
        piece: Piece = ("content", self.text[self._sent:end])
        self._sent = end
        return [piece]

    def finish(self, reason: str) -> tuple[list[Piece], str]:
        """Pieces still held and the finish reason to report (`tool_calls` when calls were made)."""
        if self.output.forced_call:
            return self._finish_forced(reason)
        assert self.markers is not None
        content, calls = parse_marked_calls(self.text, self.markers)
        pieces: list[Piece] = []
        if not calls:
            if len(self.text) > self._sent:
                pieces.append(("content", self.text[self._sent:]))
            return pieces, reason
        sent_content = self.text[:self._sent]
        if content.startswith(sent_content) and len(content) > len(sent_content):
            pieces.append(("content", content[len(sent_content):]))
        for index, call in enumerate(calls):
            pieces.append(("call", index, call.as_dict(index)))
        self.calls = calls
        return pieces, "tool_calls" if reason == "stop" else reason

    def _finish_forced(self, reason: str) -> tuple[list[Piece], str]:
        """A whole call ends `tool_calls`; a call cut by max_tokens is still a call, with the
        arguments generated so far, and `length`, as OpenAI answers it (the raw JSON is never
        content); cut before its name was complete, there is no call and no content."""
        try:
            value = json.loads(self.text)
        except ValueError:
            value = None
        if self._call is None:
            return [], reason
        whole = isinstance(value, dict)
        end = len(self.text) - 1 if whole else len(self.text)
        self.calls = [ToolCall(self._call.id, self._call.name, self.text[self._args_from:end])]
        pieces: list[Piece] = []
        if end > self._sent:
            pieces.append(("call", 0, {"index": 0, "function": {"arguments": self.text[self._sent:end]}}))
            self._sent = end
        return pieces, "tool_calls" if reason == "stop" and whole else reason

    def content(self) -> str | None:
        """The message content of the whole answer (None when it is only tool calls)."""
        if self.output.forced_call:
            return None
        if self.markers is None:
            return self.text
        content, calls = parse_marked_calls(self.text, self.markers)
        return (content or None) if calls else self.text


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The messages with `text` at the start of the system message (one is added if none)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": text + "\n\n" + messages[0]["content"]}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
