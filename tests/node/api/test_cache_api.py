"""The prefix cache through the node's HTTP API, on the real model: warm-ahead, /metrics and
/health, and four interleaved users sharing a warmed document.

One node (real aiohttp server on loopback, its engine and prefix cache opened from settings,
the embedded archive) serves the whole module.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings

pytestmark = [pytest.mark.model]

DOC = " ".join(f"Shelf {i} holds {i * 3 + 1} jars of {('plum', 'fig', 'pear', 'lime')[i % 4]} jam." for i in range(40))
RESTORED = "reame_prefix_cache_tokens_restored_total"


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    home = tmp_path_factory.mktemp("cache-node")
    # resident prefixes off: the cache's tiers are under test (tests/node/api/test_resident_api.py has them on)
    settings = node_settings(gemma_path, home, **{"model.threads": 1, "cache.enabled": True, "cache.resident": False,
                                                  "cache.directory": str(home / "cache"),
                                                  "arca.observe": False})
    with LiveNode(settings) as live:
        yield live


def chat(node, messages, max_tokens=8, **extra):
    status, headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert status == 200, body
    return body["choices"][0]["message"]["content"], body["usage"], headers


def alone(node, messages, max_tokens=8) -> str:
    """The same greedy answer from a second engine without any prefix cache."""
    from node.engine.engine import Engine, EngineConfig
    from node.engine.types import Finished, GenerationRequest, SamplingParams

    config = node.state.engine.config
    tokens = node.state.service.prompts.chat(messages)
    plain = Engine(EngineConfig(model_path=config.model_path, n_ctx=1024, n_threads=config.n_threads, n_parallel=1,
                                n_batch=config.n_batch, n_ubatch=config.n_ubatch, kv_type=config.kv_type))
    try:
        handle = plain.submit(GenerationRequest(prompt_tokens=tokens, max_tokens=max_tokens,
                                                sampling=SamplingParams(temperature=0.0),
                                                stop=tuple(node.state.model.template.stop_strings)))
        text = "".join(e.text for e in handle.iter_sync() if not isinstance(e, Finished))
    finally:
        plain.close()
    return text


def test_warm_then_request_restores_the_document(node):
    warmed = [{"role": "system", "content": DOC}]
    status, _, first = http_json("POST", f"{node.url}/v1/warm", {"messages": warmed})
    assert status == 200, first
    assert first["object"] == "warm" and first["cached_tokens"] == 0
    assert first["tokens"] - 32 < first["stored_tokens"] < first["tokens"]  # the last whole block
    status, _, again = http_json("POST", f"{node.url}/v1/warm", {"messages": warmed})
    assert again["cached_tokens"] == first["stored_tokens"]  # nothing new to prefill

    before = metric(node.url, RESTORED)
    question = [*warmed, {"role": "user", "content": "Which jam is on shelf 6?"}]
    answer, usage, headers = chat(node, question)
    assert headers["X-Reame-Cache"] == "miss"
    assert metric(node.url, RESTORED) - before == first["stored_tokens"]
    assert usage["prompt_tokens"] > first["tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": first["stored_tokens"]}  # as OpenAI reports it
    assert answer == alone(node, question)


def test_warm_validation(node):
    url = f"{node.url}/v1/warm"
    for body in ({}, {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, {"prompt": ""},
                 {"prompt": 5}, {"messages": []}):
        status, _, error = http_json("POST", url, body)
        assert status == 400, body
        assert error["error"]["type"] == "invalid_request_error"
    status, _, error = http_json("POST", url, {"prompt": "x", "model": "no-such-model"})
    assert status == 404 and error["error"]["code"] == "model_not_found"
    status, _, done = http_json("POST", url, {"prompt": DOC})  # a completion prompt
    assert status == 200 and done["stored_tokens"] > 0


def test_metrics_and_health_show_the_cache(node):
    status, _, health = http_json("GET", f"{node.url}/health")
    cache = health["cache"]
    assert cache["enabled"] is True and cache["fleet"] == "off"  # embedded archive: no L3
    assert cache["ram_entries"] >= 1 and cache["block_tokens"] == 32
    assert metric(node.url, "reame_prefix_cache_hits_total", tier="ram") >= 1
    assert metric(node.url, "reame_prefix_cache_stored_bytes_total", tier="ram") > 0
    assert metric(node.url, "reame_prefix_cache_lookups_total") >= 1
    assert metric(node.url, "reame_prefix_cache_entries", tier="disk") >= 0


def test_four_interleaved_users_share_the_warmed_document(node):
    shared = [{"role": "system", "content": DOC}]
    stored = http_json("POST", f"{node.url}/v1/warm", {"messages": shared})[2]["stored_tokens"]
    questions = [f"How many jars are on shelf {n}?" for n in (3, 11, 20, 37)]
    lookups, restored = metric(node.url, "reame_prefix_cache_lookups_total"), metric(node.url, RESTORED)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda q: chat(node, [*shared, {"role": "user", "content": q}], max_tokens=12),
                                questions))
    for answer, usage, _ in results:
        assert answer and usage["completion_tokens"] >= 1
    assert metric(node.url, "reame_prefix_cache_lookups_total") - lookups == 4
    assert metric(node.url, RESTORED) - restored >= 4 * stored


def test_served_model_renders_gguf_templates_that_print_eos(node):
    """The served model takes its template from the engine, so a GGUF template printing
    `eos_token` gets the model's real end-of-sequence text (not an empty string). The GGUF
    here has no template of its own: the engine is seen through one that carries one."""
    from dataclasses import replace
    from types import SimpleNamespace

    from node.serving.model import describe_model

    engine = node.state.engine
    source = "{% for m in messages %}{{ bos_token }}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    view = SimpleNamespace(config=engine.config, n_ctx=engine.n_ctx, token_piece=engine.token_piece,
                           model_info=replace(engine.model_info, chat_template=source))
    model = describe_model(view, node.settings)
    rendered = model.template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert rendered.endswith("hi<eos>")  # (a leading BOS is left to the tokenizer)
