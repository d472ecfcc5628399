"""Tenants and the prefix KV cache on the real model: a document one key warmed restores for
that key (`cached_tokens`), never for another key, whose identical prompt prefills from scratch;
L1 answers stay with the key that computed them.

One node (real aiohttp server on loopback, its engine and prefix cache opened from settings,
the embedded archive, two API keys) serves the module.
"""

from __future__ import annotations

import pytest

from tests.node.api.live import LiveNode, http_json, node_settings

pytestmark = [pytest.mark.model]

DOC = " ".join(f"Locker {i} keeps {i * 7 % 11 + 2} boxes of {('nails', 'tape', 'glue', 'rope')[i % 4]}."
               for i in range(30))
A = {"Authorization": "Bearer model-tenant-a"}
B = {"Authorization": "Bearer model-tenant-b"}
C = {"Authorization": "Bearer model-tenant-c"}


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    home = tmp_path_factory.mktemp("tenant-node")
    settings = node_settings(gemma_path, home, **{
        "model.threads": 1, "cache.enabled": True, "cache.directory": str(home / "cache"), "arca.observe": False,
        "server.api_keys": "model-tenant-a,model-tenant-b,model-tenant-c"})
    with LiveNode(settings) as live:
        yield live


def chat(node, headers) -> tuple[str, dict]:
    status, response_headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": [{"role": "system", "content": DOC}, {"role": "user", "content": "Which locker keeps rope?"}],
        "max_tokens": 4, "temperature": 0}, headers)
    assert status == 200, body
    node.call(node.state.service.drain())
    return response_headers["X-Reame-Cache"], body["usage"]


def test_a_prefix_warmed_under_one_key_is_cached_only_for_that_key(node):
    status, _, warmed = http_json("POST", f"{node.url}/v1/warm", {"messages": [{"role": "system", "content": DOC}]}, A)
    assert status == 200 and warmed["cached_tokens"] == 0 and warmed["stored_tokens"] > 0, warmed
    stored = warmed["stored_tokens"]

    cache, usage = chat(node, B)  # the same document under the other key: nothing restored
    assert cache == "miss" and usage["prompt_tokens_details"] == {"cached_tokens": 0}
    cache, usage = chat(node, A)  # A's own warmed document restores (from the cache, or the slot the warm
    # left resident: all its prompt); B's answer is not A's hit
    assert cache == "miss" and usage["prompt_tokens_details"]["cached_tokens"] >= stored
    cache, usage = chat(node, A)
    assert cache == "hit" and usage["prompt_tokens_details"] == {"cached_tokens": usage["prompt_tokens"]}
    cache, usage = chat(node, B)
    assert cache == "hit"  # B's own answer from the first question

    status, _, third = http_json("POST", f"{node.url}/v1/warm", {"messages": [{"role": "system", "content": DOC}]}, C)
    assert status == 200 and third["cached_tokens"] == 0  # /v1/warm tells C nothing of A's document
