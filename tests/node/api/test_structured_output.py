"""Structured output through a live node on the real Gemma model.

Fifty-odd JSON Schemas (nested objects, arrays, enums, bounded numbers, optional fields,
string formats) answered by four users at once, streamed and not, speculation on and off:
every answer that finishes parses and validates (`jsonschema`, formats checked); greedy
constrained output is identical with and without Il Suggeritore; forced tool calls and the
tool loop (calls and results sent back) through the official `openai` client; bad schemas
and grammars are 400s naming the field; the L1 key covers the schema.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import jsonschema
import openai
import pytest

from node.serving import structure
from tests.node.api.live import LiveNode, node_settings
from tests.node.near_ties import NEAR_TIE

pytestmark = pytest.mark.model

PROMPT = [{"role": "user", "content": "Write one example record as JSON."}]
CHECKER = jsonschema.FormatChecker()
S = {"type": "string", "maxLength": 8}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                                       "required": ["zone"], "additionalProperties": False}}}
# A forced call's arguments stay within this many tokens whatever a build's near-ties choose: a
# string of 12 characters written as \u escapes is 72 tokens at most, and each object is closed.
CALL_TOKENS = 96


def obj(properties: dict, required: list | None = None, **extra) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False, **extra}


def schemas() -> list[dict]:
    """Over fifty schemas, each small enough to finish within a few dozen tokens."""
    out: list[dict] = []
    scalars = [S, {"type": "integer"}, {"type": "integer", "minimum": 1, "maximum": 9},
               {"type": "number", "minimum": 0, "maximum": 1}, {"type": "boolean"},
               {"enum": ["red", "green", "blue"]}, {"type": "string", "enum": ["yes", "no"]},
               {"type": "integer", "minimum": -5, "maximum": 5}, {"type": "number", "exclusiveMinimum": 10},
               {"const": "fixed"}, {"type": "null"}, {"type": ["string", "null"], "maxLength": 6}]
    formats = ["date", "email", "uuid", "date-time", "ipv4", "time"]
    for i, scalar in enumerate(scalars):
        out.append(obj({"value": scalar}))
        out.append(obj({"id": {"type": "integer", "minimum": 0, "maximum": 999}, "field": scalar}))
    for fmt in formats:
        out.append(obj({"value": {"type": "string", "format": fmt}}))
    for scalar in scalars[:6]:
        out.append(obj({"items": {"type": "array", "items": scalar, "minItems": 1, "maxItems": 3}}))
    out += [
        obj({"person": obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}})}),
        obj({"a": obj({"b": obj({"c": S})})}),
        obj({"name": S, "nick": S}, required=["name"]),
        obj({"name": S, "tags": {"type": "array", "items": S, "maxItems": 2}}, required=["name"]),
        obj({"points": {"type": "array", "maxItems": 2,
                        "items": obj({"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "y": {"type": "integer", "minimum": 0, "maximum": 9}})}}),
        obj({"kind": {"enum": ["a", "b"]}, "size": {"enum": [1, 2, 3]}}),
        obj({"choice": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]}}),
        obj({"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}),
        obj({"word": {"type": "string", "minLength": 2, "maxLength": 5}}),
        obj({"ok": {"type": "boolean"}, "note": S, "score": {"type": "number", "minimum": 0, "maximum": 5}},
            required=["ok"]),
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
        {"enum": ["alpha", "beta", "gamma"]},
        obj({"when": {"type": "string", "format": "date"}, "who": {"type": "string", "format": "email"}}),
        obj({"level": {"type": "integer", "minimum": 1, "maximum": 3}, "label": {"enum": ["low", "mid", "high"]},
             "extra": obj({"flag": {"type": "boolean"}})}, required=["level", "label"]),
        obj({"ratio": {"type": "number", "minimum": -1, "maximum": 1}, "count": {"type": "integer", "minimum": 0}}),
    ]
    return out


SCHEMAS = schemas()


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    """The loader's engine and controller (Il Suggeritore among its sources), with a fixed cost
    line so that what is drafted does not depend on the load of the machine."""
    from node.engine.engine import Engine
    from node.assembly import build_speculator, engine_config
    from node.models.loader import plan_engine
    from node.speculative.costs import CostCurve

    settings = node_settings(gemma_path, tmp_path_factory.mktemp("structure"))
    plan = plan_engine(settings, progress=False)
    controller = build_speculator(settings, plan)
    assert controller is not None and "grammar" in controller.source_names
    controller.costs = CostCurve({1: 0.0126, 8: 0.0150}, fixed=True)
    engine = Engine(engine_config(settings, plan, speculator=controller))
    controller.bind_vocabulary(engine.token_piece, lambda text: engine.tokenize(text, add_bos=False, special=False))
    live = LiveNode(settings, engine=engine).start()
    yield live
    live.stop()
    engine.close()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)


async def ask(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str, str | None, dict]:
    """(status, text, finish_reason, headers-ish info) of one chat request, streamed or not."""
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200 or not body.get("stream"):
            payload = await response.json()
            if response.status != 200:
                return response.status, "", None, payload
            choice = payload["choices"][0]
            return 200, choice["message"]["content"], choice["finish_reason"], {"cache": response.headers["X-Reame-Cache"]}
        parts, reason = [], None
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                parts.append(choice["delta"].get("content") or "")
                reason = choice["finish_reason"] or reason
        return 200, "".join(parts), reason, {"cache": response.headers["X-Reame-Cache"]}


def request(schema: dict, i: int, **extra) -> dict:
    return {"messages": PROMPT, "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                       "strict": True}}, **extra}


@pytest.mark.timeout(1200)  # a few dozen tokens per schema, four at a time: well under a minute on a quiet machine
def test_every_schema_answer_parses_and_validates(node):
    assert len(SCHEMAS) >= 50

    async def run():
        gate = asyncio.Semaphore(4)  # four users at once
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            async def one(i: int, schema: dict):
                async with gate:
                    extra = {"stream": i % 2 == 1, "speculation": i % 4 < 2}
                    if i % 3 == 0:
                        extra["temperature"] = 0.8
                        extra["seed"] = i
                    return await ask(session, node.url, request(schema, i, **extra))
            return await asyncio.gather(*(one(i, schema) for i, schema in enumerate(SCHEMAS)))

    results = asyncio.run(run())
    cut = []
    for i, (schema, (status, text, reason, _)) in enumerate(zip(SCHEMAS, results)):
        assert status == 200, (i, schema)
        if reason == "length":
            cut.append(i)
            continue
        assert reason == "stop", (i, reason)
        value = json.loads(text)
        jsonschema.validate(value, schema, format_checker=CHECKER)
    # an unbounded number or integer lets the base model write digits until max_tokens: such an
    # answer ends with finish_reason "length" (as it must); most answers finish
    assert len(cut) <= len(SCHEMAS) // 4, f"too many answers cut by max_tokens: {cut}"
    # the tokens the grammar admits alone were taken without logits (jump-forward)
    assert node.state.engine.stats()["jumped_tokens"] > 0


def test_greedy_constrained_output_is_the_same_with_and_without_suggeritore(node):
    async def run():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            out = []
            for i in (0, 24, 37, 45, 48):
                body = request(SCHEMAS[i], 1000 + i)
                plain = await ask(session, node.url, {**body, "speculation": False, "max_tokens": 63})
                drafted = await ask(session, node.url, {**body, "speculation": True, "max_tokens": 63,
                                                        "stream": True, "stop": ["\x00never"]})
                out.append((plain, drafted))
            return out

    before = node.state.engine.stats()["jumped_tokens"]
    for i, (plain, drafted) in zip((0, 24, 37, 45, 48), asyncio.run(run())):
        assert plain[0] == drafted[0] == 200
        if plain[1] != drafted[1]:
            assert_diverged_at_a_near_tie(node, request(SCHEMAS[i], 1000 + i), drafted[1])
        else:
            assert plain[2] == drafted[2]
    assert node.state.engine.stats()["jumped_tokens"] > before  # both ways: forced tokens jumped




def assert_diverged_at_a_near_tie(node, body: dict, drafted: str) -> None:
    """Verification puts several tokens of a sequence in one ubatch, and llama.cpp's CPU kernels
    are not batch-invariant (docs/BENCHMARKS.md: logits a few tenths apart), so greedy text may
    part at a near-tie of the plain run, never at a clear margin."""
    async def plain_with_logprobs():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            reply = await session.post(f"{node.url}/v1/chat/completions",
                                       json={**body, "speculation": False, "max_tokens": 63, "logprobs": True,
                                             "top_logprobs": 2, "stop": ["\x01never"]})
            return await reply.json()

    content = asyncio.run(plain_with_logprobs())["choices"][0]["logprobs"]["content"]
    prefix = ""
    for entry in content:
        if not drafted.startswith(prefix + entry["token"]):
            top = entry["top_logprobs"]
            gap = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("inf")
            assert gap < NEAR_TIE, f"diverged after {prefix!r} at a clear margin {gap:.3f}"
            return
        prefix += entry["token"]
    raise AssertionError(f"outputs differ but no token of the plain run parts from {drafted!r}")


def test_the_l1_key_covers_the_schema(node):
    async def run():
        async with aiohttp.ClientSession() as session:
            body = request(SCHEMAS[2], 7, max_tokens=40)
            first = await ask(session, node.url, body)
            again = await ask(session, node.url, body)
            other = await ask(session, node.url, request(SCHEMAS[3], 7, max_tokens=40))
            plain = await ask(session, node.url, {k: v for k, v in body.items() if k != "response_format"})
            return first, again, other, plain
    first, again, other, plain = asyncio.run(run())
    node.call(node.state.service.drain())
    assert again[3]["cache"] == "hit" and again[1] == first[1]
    assert other[3]["cache"] == "miss" and plain[3]["cache"] == "miss"


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "dependentRequired": {"a": ["b"]}}}}}, "response_format.json_schema.schema"),
    ({"json_schema": {"type": "string", "format": "not-a-format"}}, "json_schema"),
    ({"grammar": "root ::= [unclosed"}, "grammar"),
    ({"tools": [WEATHER]}, "tools"),  # auto: Gemma's template renders no tools
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "missing"}}},
     "tool_choice.function"),
])
def test_bad_structure_is_a_400(node, extra, param):
    async def run():
        async with aiohttp.ClientSession() as session:
            return await ask(session, node.url, {"messages": PROMPT, "max_tokens": 4, **extra})
    status, _, _, payload = asyncio.run(run())
    assert status == 400 and payload["error"]["param"] == param and payload["error"]["message"]


def check_call(call, tool: dict) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_forced_tool_calls_through_the_openai_client(client):
    named = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=CALL_TOKENS, temperature=0)
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_call(choice.message.tool_calls[0], WEATHER)

    required = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "What time is it in Rome?"}],
        tools=[WEATHER, TIME], tool_choice="required", max_tokens=CALL_TOKENS, temperature=0)
    call = required.choices[0].message.tool_calls[0]
    check_call(call, WEATHER if call.function.name == "get_weather" else TIME)

    stream = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=CALL_TOKENS, temperature=0, stream=True)
    name, arguments, reason, ids = "", "", None, set()
    for chunk in stream:
        for delta_choice in chunk.choices:
            for delta in delta_choice.delta.tool_calls or []:
                assert delta.index == 0
                ids.add(delta.id) if delta.id else None
                name += (delta.function.name or "") if delta.function else ""
                arguments += (delta.function.arguments or "") if delta.function else ""
            reason = delta_choice.finish_reason or reason
    assert reason == "tool_calls" and name == "get_weather" and len(ids) == 1
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])

    plain = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice="none",
        max_tokens=4, temperature=0)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")


def test_the_tool_loop_through_the_openai_client(client):
    """Ask -> forced call -> the client sends back the assistant message and the tool's result
    -> a text answer; then the same history with a second forced call."""
    asked = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.chat.completions.create(
        model="gemma3-270m", messages=[asked], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=CALL_TOKENS, temperature=0)
    called = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    call = called.tool_calls[0]
    check_call(call, WEATHER)
    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}

    for sent_back in (called, called.model_dump(exclude_none=True), called.model_dump()):
        answer = client.chat.completions.create(
            model="gemma3-270m", messages=[asked, sent_back, result], max_tokens=24, temperature=0)
        choice = answer.choices[0]
        assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
        assert isinstance(choice.message.content, str)

    again = client.chat.completions.create(
        model="gemma3-270m", messages=[asked, called, result, {"role": "user", "content": "And the time there?"}],
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=CALL_TOKENS, temperature=0)
    assert again.choices[0].finish_reason == "tool_calls"
    second = again.choices[0].message.tool_calls[0]
    check_call(second, TIME)
    assert second.id != call.id

    done = client.chat.completions.create(
        model="gemma3-270m", messages=[asked, called, result, {"role": "user", "content": "And the time there?"},
                                       again.choices[0].message,
                                       {"role": "tool", "tool_call_id": second.id, "content": "14:05"}],
        tools=[WEATHER, TIME], max_tokens=24, temperature=0, tool_choice="none")
    assert done.choices[0].finish_reason in ("stop", "length") and isinstance(done.choices[0].message.content, str)

    with pytest.raises(openai.BadRequestError) as caught:  # a result for a call nobody made
        client.chat.completions.create(model="gemma3-270m", messages=[asked, {**result, "tool_call_id": "call_x"}],
                                       max_tokens=4)
    assert caught.value.body["param"] == "messages[1].tool_call_id"


def test_json_object_and_gbnf_through_the_openai_client(client):
    reply = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "A JSON object about a cat:"}],
        response_format={"type": "json_object"}, max_tokens=64, temperature=0)
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    completion = client.completions.create(
        model="gemma3-270m", prompt="Is water wet? Answer:", max_tokens=4, temperature=0,
        extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert completion.choices[0].text in (" yes", " no")


PRICE = {"type": "function", "function": {
    "name": "set_price", "description": "Record the price of an item",
    "parameters": {"type": "object", "properties": {"item": {"type": "string", "maxLength": 12},
                                                    "euros": {"type": "number"}},
                   "required": ["item", "euros"], "additionalProperties": False}}}
SET_PRICE = {"type": "function", "function": {"name": "set_price"}}


def test_a_forced_call_with_a_number_cannot_run_away_in_digits(client):
    """A number's digits were unbounded: the model wrote `1000000000…` (or `0.35000000…`) until
    max_tokens, and the answer came back as raw JSON in `content` with no tool call."""
    reply = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Bread costs 3 euros."}],
        tools=[PRICE], tool_choice=SET_PRICE, max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.message.content is None and choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.function.name == "set_price"
    number = call.function.arguments.split('"euros":')[-1].rstrip("}").lstrip("-")
    whole, _, decimals = number.partition(".")
    assert len(whole) <= structure.MAX_DIGITS and len(decimals) <= structure.MAX_DECIMALS, call.function.arguments
    if choice.finish_reason == "tool_calls":
        jsonschema.validate(json.loads(call.function.arguments), PRICE["function"]["parameters"])
    else:
        assert choice.finish_reason == "length"


def test_a_call_cut_by_max_tokens_is_a_call_with_partial_arguments(client):
    body = dict(model="gemma3-270m", messages=[{"role": "user", "content": "Bread costs 3 euros."}],
                tools=[PRICE], tool_choice=SET_PRICE, max_tokens=10, temperature=0)
    reply = client.chat.completions.create(**body)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "set_price" and call.id.startswith("call_")
    assert call.function.arguments.startswith("{") and "set_price" not in call.function.arguments
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)  # cut: not yet whole
    streamed, reason, content = "", None, ""
    for chunk in client.chat.completions.create(**body, stream=True):
        for delta_choice in chunk.choices:
            content += delta_choice.delta.content or ""
            for delta in delta_choice.delta.tool_calls or []:
                streamed += (delta.function.arguments or "") if delta.function else ""
            reason = delta_choice.finish_reason or reason
    assert reason == "length" and content == "" and streamed == call.function.arguments


def test_a_grammar_that_fails_as_generation_starts_is_a_short_400(client, caplog):
    """It passed the check and failed at the first mask: a 500 whose body (and log line) held
    the grammar engine's whole state, 330 KB in one case."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a?){1000}a{1000}$"}},
              "required": ["a"]}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gemma3-270m", messages=PROMPT, max_tokens=8, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    error = caught.value.response.json()["error"]
    assert error["code"] == "invalid_schema" and error["param"] == "response_format.json_schema.schema"
    assert "fails as generation starts" in error["message"] and len(caught.value.response.content) < 1000
    assert all(len(record.getMessage()) < 2000 for record in caplog.records)
