"""Structured output: what a request asks its output to be, as one grammar, and reading it back.

Requests name their structure in several dialects; each becomes one `GrammarSpec` that the
engine compiles (node/engine/grammar.py):
- OpenAI `response_format`: `{"type": "json_object"}` (any JSON object) and `{"type":
  "json_schema", "json_schema": {"name", "schema", "strict"}}`;
- llama.cpp's `grammar` (GBNF) and `json_schema`; Ollama's `format` ("json" or a schema);
- forced tool calls (`tool_choice` "required" or a named function): the output is
  `{"name": <function>, "arguments": <its parameters>}`, one object per allowed function
  (`anyOf`, node/serving/tools.py).

A schema is checked before anything runs, in two steps. While the request is parsed (on the
event loop): it must be a JSON object within the size and shape limits of
node/serving/schema_limits.py (cheap, bounded). Then `verify`, on a grammar thread with a time
budget (node/serving/grammar_workers.py): valid under its JSON Schema draft's meta-schema (the
`jsonschema` package), and using only what the grammar engine implements (llguidance names an
unimplemented keyword or format). Every failure is a 400 naming the request field, never a
silent fallback to free text. Integers and numbers are bounded to `MAX_DIGITS` digits before
the point (`bound_numbers`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from node.engine.grammar_limits import parser_limits, short_error
from node.engine.types import GrammarSpec
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.requests import GenerationOptions, Output
from node.serving.schema_limits import check_grammar_shape, check_schema_shape

JSON_COMPILE_OPTIONS: Any = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
ANY_OBJECT_TEXT = json.dumps(ANY_OBJECT, separators=(",", ":"))
MAX_DIGITS = 15  # digits before the point of a generated integer or number; the grammar engine reads a
# bound as a double, and 10**16 - 1 is not one (it reads 1e16, admitting 17 digits): 10**15 - 1 is exact
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
