"""Structured output: what a request asks its output to be, as one grammar, and reading it back.

Requests name their structure in several dialects; each becomes one `GrammarSpec` that the
engine compiles (node/engine/grammar.py):
- OpenAI `response_format`: `{"type": "json_object"}` (any JSON object) and `{"type":
  "json_schema", "json_schema": {"name", "schema", "strict"}}`;
- llama.cpp's `grammar` (GBNF) and `json_schema`; Ollama's `format` ("json" or a schema);
- forced tool calls (`tool_choice` "required" or a named function): the output is
  `{"name": <function>, "arguments": <its parameters>}`, one object per allowed function
  (`anyOf`), read back into OpenAI's `tool_calls` by `ToolCallReader`.

A schema is checked before anything runs, in two steps. While the request is parsed (on the
event loop): it must be a JSON object within the size and shape limits of
node/serving/schema_limits.py (cheap, bounded). Then `verify`, on a grammar thread with a time
budget (node/serving/grammar_workers.py): valid under its JSON Schema draft's meta-schema (the
`jsonschema` package), and using only what the grammar engine implements (llguidance names an
unimplemented keyword or format). Every failure is a 400 naming the request field, never a
silent fallback to free text. Integers and numbers are bounded to `MAX_DIGITS` digits before
the point (`bound_numbers`).

`tool_choice: "auto"` needs a chat template that renders tools and writes calls between
markers the node can find (`ToolMarkers`: Qwen 2.5 / Hermes style `<tool_call>{...}</tool_call>`);
`parse_marked_calls` reads them out of the generated text.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from node.engine.grammar_limits import parser_limits, short_error
from node.engine.types import GrammarSpec
from node.models.tool_turns import native_tool_markers
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import GenerationOptions, Output, Tool, ToolCall
from node.serving.schema_limits import check_grammar_shape, check_schema_shape

JSON_COMPILE_OPTIONS: Any = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
ANY_OBJECT_TEXT = json.dumps(ANY_OBJECT, separators=(",", ":"))
MAX_DIGITS = 16  # digits before the point of a generated integer or number, as llama.cpp's grammars bound them
DIGIT_BOUND = 10**MAX_DIGITS - 1
MAX_DECIMALS = 10  # digits after it (the finest `multipleOf` llguidance takes exactly is 1e-10)
DECIMAL_STEP = 10.0**-MAX_DECIMALS
CHECKED_FIELD = {"response_format": "response_format.json_schema.schema"}  # Output.param -> the checked field


def canonical_json(value: Any) -> str:
    """Compact JSON that keeps the key order (a schema's property order is the output's)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def schema_spec(schema: Any, param: str) -> GrammarSpec:
    """A JSON Schema as a grammar, its size and shape checked (node/serving/schema_limits.py) and
    its numbers bounded (`bound_numbers`); raises a 400 naming `param`. What costs time (the
    meta-schema, the grammar engine) is `verify`, run off the event loop."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param, code="invalid_value")
    check_schema_shape(schema, param)
    return GrammarSpec("json_schema", canonical_json(bound_numbers(schema)))


def gbnf_spec(text: Any, param: str) -> GrammarSpec:
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(f"'{param}' must be a non-empty GBNF grammar string", param=param,
                             code="invalid_value")
    check_grammar_shape(text, param)
    return GrammarSpec("gbnf", text)


def bound_numbers(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the schema whose integers and numbers have at most `MAX_DIGITS` digits before
    the point and `MAX_DECIMALS` after it (JSON bounds neither; a model can write digits until
    max_tokens): every integer or number schema gets `minimum`/`maximum` of -/+
    (10**MAX_DIGITS - 1), or keeps its own where they are tighter, and a number without a
    `multipleOf` gets `multipleOf` 10**-MAX_DECIMALS."""
    copy: dict[str, Any] = json.loads(json.dumps(schema))
    stack: list[Any] = [copy]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        stack.extend(value for key, value in node.items() if key not in ("enum", "const", "default", "examples"))
        kind = node.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if "integer" not in kinds and "number" not in kinds:
            continue
        if "number" in kinds and "multipleOf" not in node:
            node["multipleOf"] = DECIMAL_STEP
        for key, exclusive, bound, tighter in (("minimum", "exclusiveMinimum", -DIGIT_BOUND, max),
                                               ("maximum", "exclusiveMaximum", DIGIT_BOUND, min)):
            own = node.get(key)
            if isinstance(node.get(exclusive), (int, float)) and not isinstance(node.get(exclusive), bool):
                if tighter(node[exclusive], bound) == node[exclusive]:
                    continue
            if isinstance(own, (int, float)) and not isinstance(own, bool):
                node[key] = tighter(own, bound)
            elif own is None:
                node[key] = bound
    return copy


def verify(spec: GrammarSpec, param: str) -> None:
    """The checks that cost time (call it on a grammar thread, node/serving/grammar_workers.py): a
    schema is valid under its draft's meta-schema, and the grammar engine can compile the spec."""
    if spec.kind == "json_schema":
        import jsonschema
        from jsonschema.exceptions import SchemaError

        schema = json.loads(spec.text)
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path)
            raise InvalidRequest(f"'{param}' is not a valid JSON Schema: {short_error(exc.message)}"
                                 + (f" (at {short_error(where, 100)})" if where else ""), param=param,
                                 code="invalid_schema") from None
        except Exception as exc:  # a $schema naming an unknown draft, ...
            raise InvalidRequest(f"'{param}' is not a valid JSON Schema: {short_error(exc)}", param=param,
                                 code="invalid_schema") from None
    _check_grammar(spec, param)


def _check_grammar(spec: GrammarSpec, param: str) -> None:
    """Ask the grammar engine whether it can compile the spec (no vocabulary needed)."""
    import llguidance

    try:
        if spec.kind == "json_schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_COMPILE_OPTIONS)
        else:
            from llguidance.gbnf_to_lark import any_to_lark

            grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.text))
        error = llguidance.LLMatcher.validate_grammar(grammar, None, limits=parser_limits())
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the converters raise ValueError; a panic in the library is a BaseException
        error = str(exc) or type(exc).__name__
    if not error:
        return
    error = short_error(error)
    if spec.kind == "json_schema":
        if error.startswith(("Unimplemented keys", "Unknown format")) or "retriev" in error:
            raise UnsupportedFeature(f"'{param}' uses a JSON Schema feature that is not supported by this server: {error}",
                                     param=param)
        raise InvalidRequest(f"'{param}' cannot be compiled into a grammar: {error}", param=param,
                             code="invalid_schema")
    raise InvalidRequest(f"'{param}' is not a valid GBNF grammar: {error}", param=param, code="invalid_grammar")


def checks(options: GenerationOptions) -> list[tuple[str, GrammarSpec]]:
    """The (field, spec) pairs `verify` must pass for a parsed request: its grammar, and the
    parameters of every tool it offers (a tool called later must compile)."""
    output, grammar = options.output, options.sampling.grammar
    found: list[tuple[str, GrammarSpec]] = []
    if grammar is not None and output is not None and grammar.text != ANY_OBJECT_TEXT:
        found.append((CHECKED_FIELD.get(output.param, output.param), grammar))
    if output is not None:
        for index, tool in enumerate(output.tools):
            param = f"tools[{index}].function.parameters"
            found.append((param, schema_spec(json.loads(tool.parameters), param)))
    return found


def verify_all(pairs: list[tuple[str, GrammarSpec]]) -> None:
    for param, spec in pairs:
        verify(spec, param)


class Verified:
    """The (field, spec) pairs that passed `verify` lately, by digest, at most `capacity` of
    them: a schema sent again and again is checked once. Failures are never remembered."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(pair: tuple[str, GrammarSpec]) -> str:
        param, spec = pair
        return hashlib.sha256(f"{param}\x00{spec.kind}\x00{spec.text}".encode()).hexdigest()

    def pending(self, pairs: list[tuple[str, GrammarSpec]]) -> list[tuple[str, GrammarSpec]]:
        """The pairs not verified lately (the others count as used now)."""
        left = []
        with self._lock:
            for pair in pairs:
                key = self._key(pair)
                if key in self._seen:
                    self._seen.move_to_end(key)
                else:
                    left.append(pair)
        return left

    def add(self, pairs: list[tuple[str, GrammarSpec]]) -> None:
        with self._lock:
            for pair in pairs:
                self._seen[self._key(pair)] = None
                self._seen.move_to_end(self._key(pair))
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)


# ---- tool calls ---------------------------------------------------------------------------


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
