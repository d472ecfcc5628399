"""The node held to its own OpenAPI description by generated requests, on the real model.

A live node (real aiohttp server on loopback, real Gemma engine with a 128-token context so
that a generated request can never run long) serves `/openapi.json`; the tests read the
description from there and:
- let schemathesis generate requests for every operation from it, both valid under the
  schemas and not (its negative mode), send them and run its checks on each answer: never a
  500, only documented statuses and media types, error bodies matching the Error schema,
  invalid data rejected with a 4xx (a schema-valid body may still be a 400: cross-field
  rules such as `echo` with `logprobs`, or prompt plus `n` x `max_tokens` over the context,
  are the parser's, not the schema's);
- break one field of a valid body at a time with hostile values (wrong types, negative,
  zero, huge, non-ASCII, empty, over-long, NaN sent as raw JSON text) that the field's
  schema rejects: every one must be a 400 whose `param` names that field;
- afterwards the node still answers a normal request.
Bounded: a fixed number of examples per route, no shrinking deadline.
"""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import jsonschema
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from node.assembly import open_engine
from tests.node.api.live import LiveNode, node_settings

pytestmark = pytest.mark.model

HOSTILE = [None, True, False, 0, -1, 1, -(2**63), 2**64, 10**30, 0.5, -0.0, 1e308, -1e308, "", "5", "ñé日本",
           "x" * 5000, [], [1], ["a"], {}, {"a": 1}, [[]], [{"role": "user"}]]
ROUTES = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatRequest",
          "/v1/embeddings": "EmbeddingRequest", "/v1/responses": "ResponsesRequest"}
BASE = {"/v1/completions": {"prompt": "Hi", "max_tokens": 2, "temperature": 0},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                 "temperature": 0},
        "/v1/embeddings": {"input": "Hi", "encoding_format": "float"},
        "/v1/responses": {"input": "Hi", "max_output_tokens": 2, "temperature": 0, "store": False}}
EXAMPLES = 6  # per operation and mode


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    settings_ = node_settings(gemma_path, tmp_path_factory.mktemp("fuzz"), **{
        "model.context_length": 512,  # 128 a sequence, as long as a request could be at 128 cells in all
        "server.max_queue_wait_s": 0})  # generated requests of n x max_tokens queue behind each other: no 503
    engine = open_engine(settings_, progress=False)
    live = LiveNode(settings_, engine=engine).start()
    yield live
    live.stop()
    engine.close()


@pytest.fixture(scope="module")
def description(node):
    async def fetch():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{node.url}/openapi.json") as response:
                assert response.status == 200
                return await response.json()
    return asyncio.run(fetch())


def request_schema(description: dict, route: str) -> dict:
    return description["components"]["schemas"][ROUTES[route]]


def documented(description: dict, route: str) -> set[int]:
    return {int(status) for status in description["paths"][route]["post"]["responses"]}


def post_sync(url: str, raw: bytes, timeout: float = 120) -> tuple[int, bytes]:
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.post(url, data=raw, headers={"Content-Type": "application/json"}) as response:
                return response.status, await response.read()
    return asyncio.run(go())


def check_answer(description: dict, route: str, status: int, body: bytes, sent: object) -> None:
    assert status != 500, f"500 for {sent!r}: {body[:300]!r}"
    assert status in documented(description, route), f"undocumented {status} for {sent!r}: {body[:300]!r}"
    if status >= 400:
        error = "AnthropicError" if route.startswith("/v1/messages") else "Error"
        jsonschema.validate(orjson.loads(body), description["components"]["schemas"][error])


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_generated_requests_get_documented_answers(node, description, mode):
    schema = schemathesis.openapi.from_dict(description)
    operations = [result.ok() for result in schema.get_all_operations()]
    strategy = st.one_of([operation.as_strategy(generation_mode=mode) for operation in operations])

    @settings(max_examples=EXAMPLES * len(operations), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def check(case):
        if isinstance(case.body, dict) and "stream_options" in case.body and case.body.get("stream") in (None, False):
            # stream_options without stream is a documented 400 that would hide the rest of the body;
            # streaming keeps the body (dropping the field dropped the very value a negative case broke)
            case.body["stream"] = True
        if body_size(case.body) > BODY_LIMIT:  # refused before it is read: a 413, not a 400
            assert case.call(base_url=node.url, timeout=120).status_code == 413
            return
        excluded = [positive_data_acceptance]
        case.call_and_validate(base_url=node.url, timeout=120, excluded_checks=excluded)

    check()


BODY_LIMIT = 8 * 1024 * 1024  # the node's default [server] max_request_size_mb


def body_size(body: object) -> int:
    """Bytes of a generated JSON body; 0 for bodies that are not JSON (no body, raw bytes)."""
    try:
        return len(json.dumps(body).encode())
    except (TypeError, ValueError):
        return 0


def hostile_cases(schema: dict, base: dict) -> list[tuple[str, object]]:
    """(field, value) pairs where value breaks that field's schema."""
    cases = []
    for name, field_schema in schema["properties"].items():
        if "type" not in field_schema and "anyOf" not in field_schema:
            continue  # an ignored field: anything goes
        validator = jsonschema.Draft202012Validator(field_schema)
        for value in HOSTILE:
            if not validator.is_valid(value):
                cases.append((name, value))
    return cases


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_one_broken_field_is_a_400_naming_it(node, description, route):
    schema = request_schema(description, route)
    failures = []
    for name, value in hostile_cases(schema, BASE[route]):
        body = {**BASE[route], name: value}
        if name == "stream_options":
            body["stream"] = True
        status, reply = post_sync(node.url + route, json.dumps(body).encode())  # json: ints past 64 bits
        check_answer(description, route, status, reply, body)
        param = orjson.loads(reply)["error"]["param"] if status >= 400 else None
        if status != 400 or not (param == name or str(param).startswith((name + ".", name + "["))):
            failures.append(f"{name}={value!r:.60}: {status} param={param!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_numbers_json_cannot_carry_are_invalid_json(node, description, route):
    for token in (b"NaN", b"Infinity", b"-Infinity", b"1e999999"):
        raw = orjson.dumps(BASE[route])[:-1] + b', "temperature": ' + token + b"}"
        status, reply = post_sync(node.url + route, raw)
        check_answer(description, route, status, reply, raw)
        assert status == 400, (token, reply)


def test_hostile_strings_inside_messages_are_answered(node, description):
    route = "/v1/chat/completions"
    for content in ("\x00\x01\x02", "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
                    "<start_of_turn>model\n", "日本語" * 50, "\u202e\u200b"):
        body = {**BASE[route], "messages": [{"role": "user", "content": content}]}
        status, reply = post_sync(node.url + route, orjson.dumps(body))
        check_answer(description, route, status, reply, body)
        assert status == 200


def test_the_node_still_answers_after_the_fuzzing(node):
    status, reply = post_sync(node.url + "/v1/chat/completions", orjson.dumps(BASE["/v1/chat/completions"]))
    assert status == 200 and orjson.loads(reply)["choices"]
    assert not math.isnan(orjson.loads(reply)["usage"]["total_tokens"])


def test_every_route_is_described(node, description):
    described = set(description["paths"])
    served = {resource.canonical for resource in node.app.router.resources()
              if not resource.canonical.startswith("/static")}
    assert served == described, (served - described, described - served)
