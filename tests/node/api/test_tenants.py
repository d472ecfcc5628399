"""Tenants on the fake engine (tests/node/fake_engine.py): a node with two keys keeps each key's
L1 answers, embeddings and batch results to that key, and `/health` says only its status to a
caller without a key. The fake answers deterministically, which is all L1 needs; the prefix
cache's `cached_tokens` per tenant is tested on the real model in test_tenants_model.py."""

from __future__ import annotations

import time

import openai
import pytest

from node.serving.tenants import ApiKeys, tenant_id
from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.fake_engine import FakeEngine

KEY_A, KEY_B = "tenant-key-a", "tenant-key-b"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A node whose keys are A (`api_key`) and B (`api_keys`, A again), and its fake engine."""
    engine = FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")
    keys = {"server.api_key": KEY_A, "server.api_keys": f"{KEY_B}, {KEY_A}"}
    with LiveNode(node_settings(engine.config.model_path, tmp_path_factory.mktemp("home"),
                                **{"arca.observe": False, **keys}), engine=engine) as live:
        yield live, engine


@pytest.fixture
def node(keyed):
    return keyed[0]


@pytest.fixture
def fake(keyed):
    return keyed[1]


def chat(node, text: str, headers: dict) -> tuple[str, dict]:
    status, response_headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": [{"role": "user", "content": text}], "max_tokens": 40, "temperature": 0}, headers)
    assert status == 200, body
    node.call(node.state.service.drain())
    return response_headers["X-Reame-Cache"], body["usage"]


def test_an_answer_cached_under_one_key_is_a_miss_under_the_other(node, fake):
    assert chat(node, "the secret plan", A)[0] == "miss"
    assert chat(node, "the secret plan", A)[0] == "hit"
    submitted = len(fake.submitted)
    cache, usage = chat(node, "the secret plan", B)
    assert cache == "miss" and usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert len(fake.submitted) == submitted + 1  # B's request ran the model
    assert chat(node, "the secret plan", B)[0] == "hit"  # B's own answer, now cached for B
    assert chat(node, "the secret plan", A)[0] == "hit"  # A's is still A's


def test_every_api_scopes_its_hits_by_key(node, fake):
    """Completions, Ollama and embeddings go through the same keys as chat."""
    def completion(headers):
        return http_json("POST", f"{node.url}/v1/completions",
                         {"prompt": "scoped completion", "max_tokens": 20, "temperature": 0}, headers)[1]

    def embedding(headers):
        return http_json("POST", f"{node.url}/v1/embeddings", {"input": "scoped embedding"}, headers)[1]

    def ollama(headers):
        status, _, body = http_json("POST", f"{node.url}/api/generate", {
            "model": "fake", "prompt": "scoped ollama", "stream": False, "options": {"temperature": 0}}, headers)
        assert status == 200, body
        return body

    for call in (completion, embedding):
        assert call(A)["X-Reame-Cache"] == "miss"
        node.call(node.state.service.drain())
        assert call(A)["X-Reame-Cache"] == "hit"
        assert call(B)["X-Reame-Cache"] == "miss"
    ollama(A)
    node.call(node.state.service.drain())
    before = len(fake.submitted)
    ollama(A)
    assert len(fake.submitted) == before  # A's repeat is answered from L1
    ollama(B)
    assert len(fake.submitted) == before + 1  # B's is not


def test_a_batch_is_its_creators_and_uses_its_caches(node, fake):
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key=KEY_B, max_retries=0, timeout=60)
    line = b'{"custom_id": "one", "method": "POST", "url": "/v1/chat/completions", "body": ' \
           b'{"model": "fake", "messages": [{"role": "user", "content": "a batch of B"}], "max_tokens": 40, ' \
           b'"temperature": 0}}\n'
    uploaded = client.files.create(file=("input.jsonl", line), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 30
    while client.batches.retrieve(batch.id).status != "completed":
        assert time.monotonic() < deadline, "the batch never completed"
        time.sleep(0.05)
    node.call(node.state.service.drain())
    assert chat(node, "a batch of B", A)[0] == "miss"
    assert chat(node, "a batch of B", B)[0] == "hit"  # the batch's answer is B's

    # B's files and batches are B's: absent from A's lists, 404 to A by id
    output = client.batches.retrieve(batch.id).output_file_id
    assert output and client.files.content(output).content
    listed = {(path, item["id"]) for path in ("files", "batches")
              for item in http_json("GET", f"{node.url}/v1/{path}", headers=B)[2]["data"]}
    assert {("files", uploaded.id), ("files", output), ("batches", batch.id)} <= listed
    for path in ("files", "batches"):
        assert http_json("GET", f"{node.url}/v1/{path}", headers=A)[2]["data"] == []
    for method, path in (("GET", f"/v1/files/{uploaded.id}"), ("GET", f"/v1/files/{output}/content"),
                         ("DELETE", f"/v1/files/{output}"), ("GET", f"/v1/batches/{batch.id}"),
                         ("POST", f"/v1/batches/{batch.id}/cancel")):
        assert http_json(method, f"{node.url}{path}", headers=A)[0] == 404, (method, path)
    status, _, _ = http_json("POST", f"{node.url}/v1/batches", {
        "input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}, A)
    assert status == 404
    assert client.files.retrieve(output).id == output  # still there for B


def test_health_says_only_its_status_without_the_key(node):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY_A}):
        status, _, body = http_json("GET", f"{node.url}/health", headers=headers)
        assert status == 200 and body == {"status": "ok"}, body
    for headers in (A, B):
        status, _, body = http_json("GET", f"{node.url}/health", headers=headers)
        assert status == 200 and body["status"] == "ok"
        assert {"engine", "cache", "kernels", "archive", "speculation"} <= set(body)


def test_health_shows_the_details_on_a_node_without_keys(fake, tmp_path):
    settings = node_settings(fake.config.model_path, tmp_path, **{"arca.observe": False})
    with LiveNode(settings, engine=fake) as open_node:
        status, _, body = http_json("GET", f"{open_node.url}/health")
        assert status == 200 and "kernels" in body and "engine" in body


def test_both_keys_are_accepted_and_others_refused(node):
    for headers, expected in ((A, 200), (B, 200), ({"Authorization": "Bearer tenant-key-c"}, 401), ({}, 401)):
        assert http_json("GET", f"{node.url}/v1/models", headers=headers)[0] == expected
    status, _, _ = http_json("POST", f"{node.url}/v1/messages", {
        "model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        {"x-api-key": KEY_B, "anthropic-version": "2023-06-01"})
    assert status == 200


def test_a_tenant_id_does_not_reveal_its_key():
    ids = [tenant_id(key) for key in (KEY_A, KEY_B)]
    assert ids[0] != ids[1] and ids == [tenant_id(KEY_A), tenant_id(KEY_B)]  # the same on every node
    assert all(KEY_A not in tenant and KEY_B not in tenant and len(tenant) == 32 for tenant in ids)
    keys = ApiKeys.of([KEY_A, KEY_B, KEY_A, ""])
    assert len(keys.entries) == 2
    assert keys.tenant_of(KEY_B.encode()) == ids[1] and keys.tenant_of(b"tenant-key-") is None
    assert not ApiKeys.of([])


def test_a_second_node_on_the_same_archive_keeps_the_keys_apart(tmp_path):
    """Two nodes with the same keys sharing one archive: what node 1 cached under A is node 2's
    hit under A and its miss under B (the L1 key carries the key's tenant id, the same on every node)."""
    import asyncio

    from arca.archive import ArchiveConfig
    from node.archive.client import EmbeddedArchive

    shared = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=10**7, corpus_max_bytes=10**7,
                                           kv_max_bytes=10**7))
    engines = [FakeEngine(tmp_path / "fake.gguf"), FakeEngine(tmp_path / "fake.gguf")]
    keys = {"arca.observe": False, "server.api_keys": f"{KEY_A},{KEY_B}"}
    try:
        with LiveNode(node_settings(engines[0].config.model_path, tmp_path / "one", **keys), engine=engines[0],
                      archive=shared) as first, \
             LiveNode(node_settings(engines[1].config.model_path, tmp_path / "two", **keys), engine=engines[1],
                      archive=shared) as second:
            assert chat(first, "asked on node one", A)[0] == "miss"
            assert chat(second, "asked on node one", A)[0] == "hit"
            assert chat(second, "asked on node one", B)[0] == "miss"
            assert chat(first, "asked on node one", B)[0] == "hit"  # B's answer, from node two
    finally:
        asyncio.run(shared.close())
