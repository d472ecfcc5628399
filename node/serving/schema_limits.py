"""The size and shape a schema or grammar may have, checked before the grammar engine sees it.

llguidance recurses once per level of a schema (through `$ref` too) and once per chained rule
of a grammar, on the thread that calls it: about a thousand levels overflow a thread's stack
and take the whole process down. A string `pattern` whose repetitions multiply
(`(b{1000}){1000}`) makes its lexer build hundreds of megabytes. jsonschema's meta-schema
check and llguidance's compile cost time in proportion to the schema. So every schema and
grammar is measured here first, with a walk that recurses nowhere and stops at the first
limit passed, and refused with a 400 naming the field:

- JSON Schema, as OpenAI bounds structured outputs: at most `MAX_PROPERTIES` object
  properties in all, `MAX_OBJECT_DEPTH` nested object levels, `MAX_NAME_CHARS` characters of
  property names, definition names, enum and const values together, `MAX_ENUM_VALUES` enum
  values (an enum of more than `LARGE_ENUM` values: `MAX_LARGE_ENUM_CHARS` characters); and,
  for the grammar engine, `MAX_SCHEMA_DEPTH` levels of subschemas (each `$ref` followed counts
  as a level; a reference back into the path, a recursive schema, does not), `MAX_SCHEMA_NODES`
  JSON values, and every `pattern` within `MAX_PATTERN_EXPANSION` (below).
- GBNF (or Lark) text: at most `MAX_GRAMMAR_BYTES`, `MAX_RULES` rules, `MAX_GRAMMAR_NESTING`
  nested parentheses, and every rule within `MAX_PATTERN_EXPANSION`.
- A repetition count (`{m,n}`) is at most `MAX_REPEAT`, and a pattern's expansion (its
  length with every counted repetition written out, an upper bound of what its lexer
  builds) at most `MAX_PATTERN_EXPANSION`.
"""

from __future__ import annotations

import re
from typing import Any

from node.serving.errors import InvalidRequest

MAX_PROPERTIES = 5000
MAX_OBJECT_DEPTH = 10
MAX_NAME_CHARS = 120_000
MAX_ENUM_VALUES = 1000
LARGE_ENUM = 250
MAX_LARGE_ENUM_CHARS = 15_000
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_NODES = 100_000
MAX_REPEAT = 1000
MAX_PATTERN_EXPANSION = 10_000
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_RULES = 1000
MAX_GRAMMAR_NESTING = 64

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def _refuse(param: str, message: str, code: str = "invalid_schema") -> InvalidRequest:
    return InvalidRequest(f"'{param}' {message}", param=param, code=code)


def check_schema_shape(schema: dict[str, Any], param: str) -> None:
    """Raise a 400 naming `param` unless the schema is within every limit above."""
    _check_values(schema, param)
    _check_depth(schema, param)


def _check_values(schema: dict[str, Any], param: str) -> None:
    """Counts over every JSON value of the schema: nodes, properties, names, enums, patterns."""
    nodes = properties = chars = enums = 0
    stack: list[Any] = [schema]
    while stack:
        value = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise _refuse(param, f"is too large: more than {MAX_SCHEMA_NODES} JSON values")
        if isinstance(value, list):
            stack.extend(value)
            continue
        if not isinstance(value, dict):
            continue
        stack.extend(value.values())
        props = value.get("properties")
        if isinstance(props, dict):
            properties += len(props)
            chars += sum(len(name) for name in props)
        for key in ("$defs", "definitions"):
            if isinstance(value.get(key), dict):
                chars += sum(len(name) for name in value[key])
        enum = value.get("enum")
        if isinstance(enum, list):
            enums += len(enum)
            enum_chars = sum(len(item) for item in enum if isinstance(item, str))
            chars += enum_chars
            if len(enum) > LARGE_ENUM and enum_chars > MAX_LARGE_ENUM_CHARS:
                raise _refuse(param, f"has an enum of more than {LARGE_ENUM} values whose strings total more "
                              f"than {MAX_LARGE_ENUM_CHARS} characters")
        if isinstance(value.get("const"), str):
            chars += len(value["const"])
        if isinstance(value.get("pattern"), str):
            check_pattern(value["pattern"], param)
        if isinstance(value.get("patternProperties"), dict):
            for pattern in value["patternProperties"]:
                check_pattern(pattern, param)
        if properties > MAX_PROPERTIES:
            raise _refuse(param, f"has more than {MAX_PROPERTIES} object properties in all")
        if enums > MAX_ENUM_VALUES:
            raise _refuse(param, f"has more than {MAX_ENUM_VALUES} enum values in all")
        if chars > MAX_NAME_CHARS:
            raise _refuse(param, f"has more than {MAX_NAME_CHARS} characters of property names, definition "
                          "names, enum and const values")


def _subschemas(node: dict[str, Any], root: dict[str, Any]) -> list[Any]:
    children: list[Any] = []
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            children.extend(node[key].values())
    for key in SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            children.append(node[key])
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            children.extend(node[key])
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        if target is not None:
            children.append(target)
    return [child for child in children if isinstance(child, dict)]


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """The local target of a `$ref` ("#", "#/$defs/x", ...), or None (not local, not found)."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or isinstance(node.get("properties"), dict)


def _check_depth(root: dict[str, Any], param: str) -> None:
    """The longest path of subschemas (and of object levels) a depth-first walk that follows
    every `$ref` meets, as the grammar engine's own recursion does; a schema already on the path
    (recursion) ends it, a schema already measured is not walked again."""
    memo: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    stack: list[tuple[dict[str, Any], list[Any], list[int]]] = []  # node, children left, [depth, objects] below

    def push(node: dict[str, Any]) -> None:
        if len(stack) >= MAX_SCHEMA_DEPTH:
            raise _refuse(param, f"nests subschemas (through $ref too) more than {MAX_SCHEMA_DEPTH} levels deep")
        objects = sum(1 for entry in stack if _is_object(entry[0])) + _is_object(node)
        if objects > MAX_OBJECT_DEPTH:
            raise _refuse(param, f"nests objects more than {MAX_OBJECT_DEPTH} levels deep")
        on_path.add(id(node))
        stack.append((node, _subschemas(node, root), [0, 0]))

    push(root)
    while stack:
        node, children, below = stack[-1]
        if children:
            child = children.pop()
            done = memo.get(id(child))
            if done is not None:
                below[0], below[1] = max(below[0], done[0]), max(below[1], done[1])
                if len(stack) + done[0] > MAX_SCHEMA_DEPTH:
                    raise _refuse(param, f"nests subschemas (through $ref too) more than {MAX_SCHEMA_DEPTH} "
                                  "levels deep")
                if sum(1 for entry in stack if _is_object(entry[0])) + done[1] > MAX_OBJECT_DEPTH:
                    raise _refuse(param, f"nests objects more than {MAX_OBJECT_DEPTH} levels deep")
            elif id(child) not in on_path:
                push(child)
            continue
        stack.pop()
        on_path.discard(id(node))
        mine = (below[0] + 1, below[1] + _is_object(node))
        memo[id(node)] = mine
        if stack:
            parent = stack[-1][2]
            parent[0], parent[1] = max(parent[0], mine[0]), max(parent[1], mine[1])


# ---- patterns and grammars -----------------------------------------------------------------

_COUNT = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")


def check_pattern(pattern: str, param: str) -> None:
    size = expansion(pattern, gbnf=False, param=param)
    if size > MAX_PATTERN_EXPANSION:
        raise _refuse(param, f"has a pattern whose repetitions expand to more than {MAX_PATTERN_EXPANSION} "
                      f"characters: {pattern[:80]!r}")


def expansion(text: str, *, gbnf: bool, param: str) -> int:
    """An upper bound of the text's length with every counted repetition written out; a count
    over `MAX_REPEAT` is refused. In GBNF, quoted strings and rule names are single atoms."""
    groups: list[list[int]] = [[0, 0]]  # per open group: [total so far, size of the last atom]
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        atom = 1
        if c == "\\":
            i += 2
        elif c == "[":
            j = i + 1
            if j < n and text[j] == "^":
                j += 1
            if j < n and text[j] == "]":
                j += 1
            while j < n and text[j] != "]":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif gbnf and c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif gbnf and c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif gbnf and c.isspace():
            i += 1
            continue
        elif c == "(":
            groups.append([0, 0])
            i += 1
            continue
        elif c == ")" and len(groups) > 1:
            atom = groups.pop()[0]
            i += 1
        elif c == "|":
            i += 1
            continue  # alternatives add up: the bound stays a bound
        elif c == "{" and _COUNT.match(text, i):
            match = _COUNT.match(text, i)
            assert match is not None
            low = int(match.group(1))
            high = int(match.group(3)) if match.group(3) else low + 1 if match.group(2) else low
            count = max(low, high)
            if count > MAX_REPEAT:
                raise _refuse(param, f"repeats something {count} times; at most {MAX_REPEAT} is allowed",
                              "invalid_grammar" if gbnf else "invalid_schema")
            group = groups[-1]
            group[0] += group[1] * (max(count, 1) - 1)
            group[1] *= max(count, 1)
            i = match.end()
            continue
        else:
            i += 1
        group = groups[-1]
        group[0] += atom
        group[1] = atom
    return sum(group[0] for group in groups)


_RULE = re.compile(r"^\s*\??[A-Za-z_][\w.-]*(?:\{[^}\n]*\})?\s*(?:::=|:)", re.M)


def check_grammar_shape(text: str, param: str) -> None:
    """Raise a 400 naming `param` unless the GBNF (or Lark) text is within the limits above."""
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise _refuse(param, f"is longer than {MAX_GRAMMAR_BYTES} bytes", "invalid_grammar")
    rules = _RULE.findall(text)
    if len(rules) > MAX_RULES:
        raise _refuse(param, f"has more than {MAX_RULES} rules", "invalid_grammar")
    depth = deepest = 0
    quoted = False
    for index, c in enumerate(text):
        if c == '"' and (index == 0 or text[index - 1] != "\\"):
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif not quoted and c == ")":
            depth -= 1
    if deepest > MAX_GRAMMAR_NESTING:
        raise _refuse(param, f"nests parentheses more than {MAX_GRAMMAR_NESTING} deep", "invalid_grammar")
    for rule in _RULE.split(text):
        if expansion(rule, gbnf=True, param=param) > MAX_PATTERN_EXPANSION:
            raise _refuse(param, f"has a rule whose repetitions expand to more than {MAX_PATTERN_EXPANSION} "
                          "symbols", "invalid_grammar")
