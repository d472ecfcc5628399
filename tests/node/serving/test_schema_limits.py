"""Schemas and grammars the grammar engine cannot take are 400s naming the field; the process lives.

Each hostile input is tried in a child process (a segfault there is an exit code, not the
end of the test run): a schema chaining a thousand `$ref`s and a GBNF chain of 4,000 rules
overflowed llguidance's stack (SIGSEGV) on the way in. OpenAI's structured-output limits
(properties, object depth, names and enums), repetition counts in patterns, and the digits a
generated integer or number may have, are tested on the parser directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.api.errors import error_reply
from node.api.schemas import parse_chat
from node.serving import schema_limits, structure
from node.serving.errors import InvalidRequest, Overloaded
from node.serving.grammar_workers import GrammarWorkers

ROOT = Path(__file__).resolve().parents[3]
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def checked(body: dict):
    req = parse_chat({**CHAT, **body})
    structure.verify_all(structure.checks(req.options))
    return req


def fmt(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def ref_chain(links: int) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def rule_chain(rules: int) -> str:
    return "\n".join(["root ::= r0", *(f'r{i} ::= "a" r{i + 1}' for i in range(rules)), f'r{rules} ::= "b"'])


CHILD = """
import json, sys
from node.api.errors import error_reply
from node.api.schemas import parse_chat
from node.serving import structure
body = json.loads(sys.stdin.read())
try:
    structure.verify_all(structure.checks(parse_chat(body).options))
    print(json.dumps({"status": 200}))
except Exception as exc:
    reply = error_reply(exc)
    print(json.dumps({"status": reply.status, **reply.body()["error"]}))
"""


def in_child(body: dict) -> tuple[int, dict, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps({**CHAT, **body}), capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    return done.returncode, json.loads(done.stdout or "{}"), time.monotonic() - started


@pytest.mark.parametrize("body, param", [
    (fmt(ref_chain(1000)), "response_format.json_schema.schema"),
    ({"json_schema": ref_chain(5000)}, "json_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ref_chain(1000)}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"grammar": rule_chain(4000)}, "grammar"),
])
def test_inputs_that_overflowed_the_grammar_engine_are_400s_and_the_process_lives(body, param):
    code, error, took = in_child(body)
    assert code == 0, f"the process died (exit {code})"
    assert error["status"] == 400 and error["param"] == param and error["message"], error
    assert took < 10  # the GBNF chain alone froze the parser 9 s before it crashed


def test_a_chain_within_the_limits_and_a_recursive_schema_still_compile():
    checked(fmt(ref_chain(8)))
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}}}
    checked(fmt(tree))
    checked({"grammar": rule_chain(200)})


def many(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("schema, words", [
    (many(schema_limits.MAX_PROPERTIES + 1), "object properties"),
    (nested(schema_limits.MAX_OBJECT_DEPTH + 1), "nests objects"),
    ({"enum": [f"v{i}" for i in range(schema_limits.MAX_ENUM_VALUES + 1)]}, "enum values"),
    ({"enum": ["x" * 100] * 300}, "enum of more than"),
    ({"type": "object", "properties": {"k" * 60_000: {"type": "string"}, "j" * 60_001: {"type": "string"}}},
     "characters of property names"),
    ({"type": "string", "pattern": "^(b{1000}){1000}$"}, "expand"),
    ({"type": "string", "pattern": "^a{5000}$"}, "at most"),
    ({"type": "object", "patternProperties": {"^(x{200}){200}$": {"type": "string"}}}, "expand"),
])
def test_openai_limits_and_exploding_patterns_are_400s_before_any_compile(schema, words):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({**CHAT, **fmt(schema)})  # the parse alone refuses it: nothing reached the grammar engine
    assert caught.value.param == "response_format.json_schema.schema" and words in caught.value.message
    assert error_reply(caught.value).status == 400 and len(caught.value.message) < 400


def test_the_limits_themselves_pass():
    checked(fmt(many(300)))
    checked(fmt(nested(schema_limits.MAX_OBJECT_DEPTH)))
    checked(fmt({"type": "string", "pattern": "^[A-Z]{3}-(\\d{2}){1,4}$"}))


def test_tools_share_one_property_budget():
    """128 tools of 300 properties froze the loop 14 s: as one forced call's grammar, too many."""
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": many(300)}} for i in range(128)]
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({**CHAT, "tools": tools})
    assert caught.value.param == "tools" and "object properties" in caught.value.message


@pytest.mark.parametrize("rules, param_words", [
    ("root ::= " + "(" * 100 + '"a"' + ")" * 100, "parentheses"),
    ('root ::= ("b"{1000}){1000}', "expand"),
    ('root ::= "a"' + " " * (schema_limits.MAX_GRAMMAR_BYTES), "bytes"),
    (rule_chain(schema_limits.MAX_RULES + 1), "rules"),
])
def test_grammar_shape_limits(rules, param_words):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({**CHAT, "grammar": rules})
    assert caught.value.param == "grammar" and param_words in caught.value.message


def test_the_digit_bound_survives_the_grammar_engines_reading_as_a_double():
    """The grammar engine reads `maximum` as a double: 9,999,999,999,999,999 became 1e16 there,
    and a forced tool call wrote 10000000000000000 (17 digits) under the 16-digit bound."""
    assert int(float(structure.DIGIT_BOUND)) == structure.DIGIT_BOUND
    assert len(str(structure.DIGIT_BOUND)) == structure.MAX_DIGITS


def test_integers_and_numbers_are_bounded_to_fifteen_digits_and_ten_decimals():
    bound = 10**structure.MAX_DIGITS - 1
    spec = structure.schema_spec({"type": "object", "properties": {
        "n": {"type": "number"}, "i": {"type": ["integer", "null"], "minimum": 0},
        "tight": {"type": "integer", "minimum": -5, "maximum": 5},
        "x": {"type": "number", "exclusiveMaximum": 10}}}, "format")
    props = json.loads(spec.text)["properties"]
    assert (props["n"]["minimum"], props["n"]["maximum"], props["n"]["multipleOf"]) == (-bound, bound, 1e-10)
    assert (props["i"]["minimum"], props["i"]["maximum"]) == (0, bound) and "multipleOf" not in props["i"]
    assert (props["tight"]["minimum"], props["tight"]["maximum"]) == (-5, 5)
    assert "maximum" not in props["x"] and props["x"]["minimum"] == -bound


def test_grammar_work_has_a_time_budget():
    workers = GrammarWorkers(threads=1, budget_s=0.3)
    slow = workers.submit(time.sleep, 1.0)
    with pytest.raises(Overloaded):  # waited its whole budget behind the slow one: never runs
        workers.call("json_schema", time.sleep, 0.0)
    slow.result()
    with pytest.raises(InvalidRequest) as caught:  # ran past its budget: a 400 naming the field
        workers.call("json_schema", time.sleep, 1.0)
    assert caught.value.param == "json_schema" and "longer than 0.3 s" in caught.value.message
    workers.close()


MARGIN = """
import json
from node.engine.types import GrammarSpec
from node.serving import structure
from node.serving.grammar_workers import GrammarWorkers
from tests.node.serving.test_schema_limits import ref_chain
spec = GrammarSpec("json_schema", json.dumps(ref_chain(1000)))  # past the limits: only the stack stands between
GrammarWorkers(threads=1, budget_s=60).call("json_schema", structure.verify, spec, "json_schema")
print("alive")
"""


def test_the_grammar_threads_stacks_hold_what_a_default_stack_cannot():
    """The limits keep the recursion far below even a default thread's stack; the grammar
    threads' 64 MiB stacks are the margin: the chain that overflowed a default stack compiles."""
    done = subprocess.run([sys.executable, "-c", MARGIN], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "alive", (done.returncode, done.stderr[-500:])


def test_verified_pairs_are_remembered_and_failures_never():
    verified = structure.Verified(capacity=2)
    good = [("json_schema", structure.schema_spec({"type": "string"}, "json_schema"))]
    assert verified.pending(good) == good
    verified.add(good)
    assert verified.pending(good) == []
    bad = [("json_schema", structure.schema_spec({"type": "nope"}, "json_schema"))]
    with pytest.raises(InvalidRequest):
        structure.verify_all(verified.pending(bad))
    assert verified.pending(bad) == bad  # only what passed is added, by the caller, after it passed
    verified.add([("a", good[0][1]), ("b", good[0][1])])
    assert verified.pending(good) == good  # the oldest went when the third came
