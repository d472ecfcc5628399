"""Ollama's API through the official `ollama` client and LangChain's `ChatOllama`, against a live
node on the real Gemma model that requires an API key (sent as `Authorization: Bearer`).

Chat and generate, streamed and not; `format` as "json" and as a schema; options (an unknown
key is a 400 naming it, num_ctx over the node's context a 400, num_predict honoured); generate's
`context` continued and `raw`; list, show, ps and version; errors in Ollama's envelope with its
status codes; a repeated greedy /api/chat is an L1 hit (header, metrics, savings ledger). Tool
calls chosen by the model need a template that renders tools: a second node serves a copy of
the same GGUF with such a template in its metadata (tests/node/gguf_template.py).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.node.gguf_template import with_chat_template

pytestmark = pytest.mark.model

KEY = "ollama-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "gemma3-270m"
ASK = [{"role": "user", "content": "Name a color."}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{"server.api_key": KEY,
                                                                            "model.extra_buffers": "off"})
    with LiveNode(settings) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return ollama.Client(host=node.url, headers=AUTH, timeout=300)


def test_list_show_ps_and_version(client, node):
    listed = client.list().models
    assert [m.model for m in listed] == [f"{MODEL}:latest"]
    assert listed[0].size > 100_000_000 and listed[0].digest == node.state.model.fingerprint
    assert listed[0].details.format == "gguf" and listed[0].details.family == "gemma3"
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion"]  # Gemma's built-in template renders no tools
    assert shown.template == node.state.model.template.source and shown.details.family == "gemma3"
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert client.show(f"{MODEL}:latest").details == shown.details
    running = client.ps().models
    assert running[0].name == f"{MODEL}:latest" and running[0].context_length == node.state.model.n_ctx
    assert running[0].expires_at.year == 9999  # loaded for as long as the node runs
    status, _, body = http_json("GET", f"{node.url}/api/version", headers=AUTH)
    assert status == 200 and body["version"]


def test_chat_answer_shape(client):
    reply = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert reply.model == MODEL and reply.created_at.endswith("Z") and reply.done
    assert reply.message.role == "assistant" and reply.message.content
    assert reply.done_reason in ("stop", "length")
    assert reply.prompt_eval_count > 5 and 0 < reply.eval_count <= 8
    assert reply.total_duration >= reply.eval_duration >= 0 and reply.load_duration == 0


def test_streamed_chat_matches_the_whole_answer(client):
    ask = [{"role": "user", "content": "Say hello."}]
    whole = client.chat(model=MODEL, messages=ask, options=GREEDY)
    parts = list(client.chat(model=MODEL, messages=ask, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].prompt_eval_count == whole.prompt_eval_count
    assert parts[-1].done_reason == whole.done_reason


def test_generate_streamed_raw_and_continued_with_its_context(client, node):
    first = client.generate(model=MODEL, prompt="The sky is", options=GREEDY)
    assert first.response and first.done and first.context
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    streamed = list(client.generate(model=MODEL, prompt="The sky is", options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == first.response and streamed[-1].context == first.context
    follow = client.generate(model=MODEL, prompt="And the sea?", context=first.context, options=GREEDY)
    assert follow.context[:len(first.context)] == first.context  # continued from those tokens
    assert follow.prompt_eval_count > len(first.context)
    raw = client.generate(model=MODEL, prompt="1, 2, 3,", raw=True, options={"temperature": 0, "num_predict": 6})
    assert raw.context is None  # raw mode returns no context, as Ollama's does
    status, _, plain = http_json("POST", f"{node.url}/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 6,
                                                                        "temperature": 0}, headers=AUTH)
    assert status == 200 and raw.response == plain["choices"][0]["text"]  # no template in raw mode


def test_options_map_to_sampling(client):
    short = client.chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"
    seeded = [client.chat(model=MODEL, messages=ASK, options={"temperature": 0.9, "top_k": 20, "top_p": 0.9,
                                                                 "min_p": 0.05, "seed": 11, "num_predict": 6,
                                                                 "repeat_penalty": 1.1, "repeat_last_n": 32,
                                                                 "presence_penalty": 0.2, "frequency_penalty": 0.1,
                                                                 "num_ctx": 1024, "typical_p": 1.0})
              for _ in range(2)]
    assert seeded[0].message.content == seeded[1].message.content
    # A stop string from the answer's first tokens: two greedy runs may part at a near-tie further
    # on (tests/node/near_ties.py), and this one drafts from the first answer.
    early = client.chat(model=MODEL, messages=ASK, options={**GREEDY, "num_predict": 4}).message.content
    stop = early.strip().split()[-1]
    stopped = client.chat(model=MODEL, messages=ASK, options={**GREEDY, "stop": [stop]})
    assert stop not in stopped.message.content and stopped.done_reason == "stop"
    filled = client.chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": -1, "num_ctx": 40})
    assert filled.prompt_eval_count + filled.eval_count <= 40


@pytest.mark.parametrize("options, named", [
    ({"not_an_option": 1}, "options.not_an_option"),
    ({"num_ctx": 999_999}, "options.num_ctx"),
    ({"temperature": "hot"}, "options.temperature"),
    ({"mirostat": 2}, "options.mirostat"),
    ({"num_gpu": 1}, "options.num_gpu"),
    ({"num_predict": 0}, "options.num_predict"),
])
def test_bad_options_are_400s_naming_the_option(client, options, named):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=ASK, options=options)
    assert caught.value.status_code == 400 and named in caught.value.error


def test_format_json_and_schema(client):
    asked = [{"role": "user", "content": "Write one example record as JSON."}]
    loose = client.chat(model=MODEL, messages=asked, format="json", options={"temperature": 0, "num_predict": 60})
    if loose.done_reason == "stop":
        assert isinstance(json.loads(loose.message.content), dict)
    else:  # cut by num_predict: still the start of one object
        assert loose.message.content.lstrip().startswith("{")
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["color", "count"], "additionalProperties": False}
    for reply in (client.chat(model=MODEL, messages=asked, format=schema, options={"temperature": 0, "num_predict": 40}),
                  client.generate(model=MODEL, prompt="A record:", format=schema,
                                  options={"temperature": 0, "num_predict": 40})):
        text = reply.message.content if isinstance(reply, ollama.ChatResponse) else reply.response
        jsonschema.validate(json.loads(text), schema)
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=asked, format={"type": "object", "properties": 5})
    assert caught.value.status_code == 400 and "format" in caught.value.error


def test_errors_in_ollama_envelope(client, node):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="llama3.2", messages=ASK)
    assert caught.value.status_code == 404 and "llama3.2" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=node.url).list()  # no key
    assert caught.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": [b"\x89PNG"]}])
    assert caught.value.status_code == 400 and "images" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=ASK, think=True)
    assert caught.value.status_code == 400 and "think" in caught.value.error
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=ASK, tools=[tool])
    assert caught.value.status_code == 400 and "does not support tools" in caught.value.error
    for path, body in (("/api/chat", b"{not json"), ("/api/nothing", b"{}")):
        answer = httpx.post(f"{node.url}{path}", content=body, headers=AUTH)
        assert answer.status_code in (400, 404) and list(answer.json()) == ["error"]
        assert isinstance(answer.json()["error"], str)
    streamed = httpx.post(f"{node.url}/api/chat", json={"model": MODEL, "messages": ASK, "options": {"bad": 1}},
                          headers=AUTH)  # streamed by default: refused before the stream starts
    assert streamed.status_code == 400 and "options.bad" in streamed.json()["error"]


def test_loading_requests_and_keep_alive(client):
    assert client.generate(model=MODEL, keep_alive="10m").done_reason == "load"
    assert client.chat(model=MODEL, messages=[], keep_alive=-1).done_reason == "load"
    assert client.chat(model=MODEL, messages=ASK, options=GREEDY, keep_alive="1h30m").done
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=ASK, keep_alive="soon")
    assert caught.value.status_code == 400 and "keep_alive" in caught.value.error


def test_embed_routes_answer_the_service_embeddings(client):
    both = client.embed(model=MODEL, input=["The cat sleeps.", "A kitten naps."])
    assert len(both.embeddings) == 2 and len(both.embeddings[0]) > 0 and both.prompt_eval_count > 0
    norm = sum(x * x for x in both.embeddings[0]) ** 0.5
    assert abs(norm - 1.0) < 1e-3  # normalised, as /v1/embeddings answers
    one = client.embeddings(model=MODEL, prompt="The cat sleeps.")
    assert max(abs(a - b) for a, b in zip(one.embedding, both.embeddings[0])) < 1e-4  # the same input, the same vector
    short = client.embed(model=MODEL, input="The cat sleeps.", dimensions=64)
    assert len(short.embeddings[0]) == 64


def test_a_repeated_greedy_chat_is_an_l1_hit(node):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count: one, two,"}], "stream": False,
            "options": {"temperature": 0, "num_predict": 6}}
    hits = metric(node.url, "reame_archive_hits_total", headers=AUTH)
    status, headers, first = http_json("POST", f"{node.url}/api/chat", body, headers=AUTH)
    assert status == 200 and headers["X-Reame-Cache"] == "miss"
    node.call(node.state.service.drain())
    before = node.state.savings.report()["since_start"]["saved"]["l1"]["tokens"]
    status, headers, second = http_json("POST", f"{node.url}/api/chat", body, headers=AUTH)
    assert status == 200 and headers["X-Reame-Cache"] == "hit"
    assert second["message"] == first["message"] and second["eval_count"] == first["eval_count"]
    assert metric(node.url, "reame_archive_hits_total", headers=AUTH) == hits + 1
    assert node.state.savings.report()["since_start"]["saved"]["l1"]["tokens"] > before
    sampled = http_json("POST", f"{node.url}/api/chat", {**body, "options": {"temperature": 0.8, "num_predict": 4}},
                        headers=AUTH)
    assert sampled[1]["X-Reame-Cache"] == "bypass"


def test_langchain_chat_ollama(node):
    langchain_ollama = pytest.importorskip("langchain_ollama")
    chat = langchain_ollama.ChatOllama(model=MODEL, base_url=node.url, temperature=0, num_predict=20,
                                       client_kwargs={"headers": AUTH})
    reply = chat.invoke("Name a color.")
    assert reply.content and reply.usage_metadata["output_tokens"] <= 20
    streamed = "".join(chunk.content for chunk in chat.stream("Name a color."))
    assert streamed == reply.content
    picked = chat.with_structured_output({"title": "Pick", "type": "object",
                                          "properties": {"color": {"enum": ["red", "blue"]}},
                                          "required": ["color"]}, method="json_schema").invoke("Pick a color.")
    assert picked["color"] in ("red", "blue")


# A template in the style of Qwen 2.5 / Hermes on Gemma's turns: tools in a system turn, an
# assistant's content then its calls between <tool_call> markers, results in a user turn. A result
# is a plain "Result:" line, not Hermes' <tool_response> tags: beside them this base model starts
# its own turns with a <tool_response> of its making instead of a call.
TOOLS_TEMPLATE = """\
{%- if tools %}<start_of_turn>system
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><end_of_turn>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<start_of_turn>user
Result: {{ message.content }}<end_of_turn>
{% elif message.role == "assistant" and message.tool_calls %}<start_of_turn>model
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls %}
<tool_call>{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<end_of_turn>
{% else %}<start_of_turn>{{ 'model' if message.role == 'assistant' else message.role }}
{{ message.content }}<end_of_turn>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}"""
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


CITIES = {"Paris": "18 C, sunny", "Oslo": "3 C, snow", "Lima": "22 C, fog"}


def shots() -> list[dict]:
    """Earlier turns in which each question was answered by a call and the call by its result.

    No sentence follows a result: after one, a base model this small copies the last sentence
    instead of calling (ahead of a call by 1.6 nats with AVX-512 kernels, 1.8 with AVX2 only);
    after these turns a call leads the next best first token by 2.6 nats on both."""
    out: list[dict] = []
    for city, weather in CITIES.items():
        out += [{"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}]},
                {"role": "tool", "tool_name": "get_weather", "content": weather}]
    return out


@pytest.fixture(scope="module")
def tools_node(gemma_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("tools-home")
    model = with_chat_template(gemma_path, home / "gemma-tools.gguf", TOOLS_TEMPLATE)
    settings = node_settings(model, home, **{"server.api_key": KEY, "model.extra_buffers": "off",
                                             "server.model_id": MODEL})
    with LiveNode(settings) as live:
        yield live


def test_tool_calls_chosen_by_the_model(tools_node):
    client = ollama.Client(host=tools_node.url, headers=AUTH, timeout=300)
    assert "tools" in client.show(MODEL).capabilities
    messages = [*shots(), {"role": "user", "content": "What is the weather in Rome?"}]
    reply = client.chat(model=MODEL, messages=messages, tools=[WEATHER], options={"temperature": 0, "num_predict": 40})
    calls = reply.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and reply.done_reason in ("stop", "length")
    assert isinstance(calls[0].function.arguments, dict) and calls[0].function.arguments.get("city")
    parts = list(client.chat(model=MODEL, messages=messages, tools=[WEATHER], stream=True,
                             options={"temperature": 0, "num_predict": 40}))
    streamed = [call for part in parts for call in part.message.tool_calls or []]
    assert [c.function.model_dump() for c in streamed] == [c.function.model_dump() for c in calls]
    follow = client.chat(model=MODEL, messages=[*messages, reply.message,
                                                {"role": "tool", "tool_name": "get_weather", "content": "9 C, rain"}],
                         tools=[WEATHER], options={"temperature": 0, "num_predict": 20})
    assert follow.done and (follow.message.content or follow.message.tool_calls)
    with pytest.raises(ollama.ResponseError) as caught:  # a result answering no call
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"},
                                           {"role": "tool", "tool_name": "get_weather", "content": "9 C"}])
    assert caught.value.status_code == 400 and "messages[1]" in caught.value.error


def test_langchain_bind_tools(tools_node):
    langchain_ollama = pytest.importorskip("langchain_ollama")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    chat = langchain_ollama.ChatOllama(model=MODEL, base_url=tools_node.url, temperature=0, num_predict=40,
                                       client_kwargs={"headers": AUTH}).bind_tools([WEATHER])
    history: list = []
    for number, (city, weather) in enumerate(CITIES.items()):
        history += [HumanMessage(f"What is the weather in {city}?"),
                    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": city}, "id": f"c{number}"}]),
                    ToolMessage(weather, tool_call_id=f"c{number}")]
    reply = chat.invoke([*history, HumanMessage("What is the weather in Rome?")])
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "get_weather"


def test_a_session_continues_through_api_chat(node):
    status, _, created = http_json("POST", f"{node.url}/v1/sessions", headers=AUTH)
    assert status == 200
    session = ollama.Client(host=node.url, headers={**AUTH, "X-Reame-Session": created["id"]}, timeout=300)
    first = session.chat(model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], options=GREEDY)
    second = session.chat(model=MODEL, messages=[{"role": "user", "content": "And a color?"}], options=GREEDY)
    assert second.prompt_eval_count > first.prompt_eval_count + first.eval_count  # the first turn is in it
    status, _, held = http_json("GET", f"{node.url}/v1/sessions/{created['id']}", headers=AUTH)
    assert status == 200 and [m["role"] for m in held["history"]] == ["user", "assistant"] * 2
