"""POST /v1/embeddings through the official `openai` client and LangChain's OpenAIEmbeddings,
against a live node on the real Gemma model, behind an API key."""

from __future__ import annotations

import base64
import threading

import numpy as np
import openai
import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings, settled

pytestmark = pytest.mark.model

KEY = "embedding-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{
        "server.api_key": KEY, "embeddings.batch_tokens": 128, "embeddings.max_inputs": 300,
        "embeddings.max_request_tokens": 4000})
    with LiveNode(settings) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def vec(item) -> np.ndarray:
    return np.asarray(item.embedding, dtype=np.float32)


def test_string_list_and_token_inputs(client, node):
    one = client.embeddings.create(model="gemma3-270m", input="The cat sat on the mat.", encoding_format="float")
    assert one.object == "list" and one.model == "gemma3-270m" and len(one.data) == 1
    assert one.data[0].object == "embedding" and one.data[0].index == 0
    full = vec(one.data[0])
    assert full.shape == (node.state.engine.embedding_info.n_embd,) == (640,)
    assert abs(float(np.linalg.norm(full)) - 1.0) < 1e-5
    tokens = node.state.engine.tokenize("The cat sat on the mat.", add_bos=True, special=False)
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(tokens)

    many = client.embeddings.create(model="gemma3-270m", input=["Red.", "The cat sat on the mat.", "Blue."],
                                    encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    assert np.allclose(vec(many.data[1]), full, atol=1e-5)
    by_ids = client.embeddings.create(model="gemma3-270m", input=tokens, encoding_format="float")
    assert np.allclose(vec(by_ids.data[0]), full, atol=1e-5)
    nested = client.embeddings.create(model="gemma3-270m", input=[tokens, tokens[:4]], encoding_format="float")
    assert len(nested.data) == 2 and np.allclose(vec(nested.data[0]), full, atol=1e-5)
    assert nested.usage.prompt_tokens == len(tokens) + 4


def test_base64_is_the_whole_little_endian_float32_vector(client, node):
    text = "Base64 carries the same vector."
    floats = vec(client.embeddings.create(model="gemma3-270m", input=text, encoding_format="float").data[0])
    status, _, body = http_json("POST", f"{node.url}/v1/embeddings",
                                {"input": text, "encoding_format": "base64"}, AUTH)
    assert status == 200
    raw = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert raw.shape == (640,) and np.array_equal(raw, floats)
    # the client asks for base64 when no format is given, and decodes it itself
    decoded = client.embeddings.create(model="gemma3-270m", input=text)
    assert np.array_equal(vec(decoded.data[0]), floats)


def test_dimensions_truncate_and_renormalise(client):
    text = "Shorter vectors, still unit length."
    full = vec(client.embeddings.create(model="gemma3-270m", input=text, encoding_format="float").data[0])
    short = vec(client.embeddings.create(model="gemma3-270m", input=text, dimensions=64,
                                         encoding_format="float").data[0])
    assert short.shape == (64,) and abs(float(np.linalg.norm(short)) - 1.0) < 1e-5
    assert np.allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)
    b64 = client.embeddings.create(model="gemma3-270m", input=text, dimensions=64)
    assert np.allclose(vec(b64.data[0]), short, atol=1e-7)
    for bad in (641, 0):
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model="gemma3-270m", input=text, dimensions=bad)
        assert caught.value.body["param"] == "dimensions" and "640" in caught.value.body["message"]


def test_similar_texts_are_closer_than_unrelated_ones(client):
    rows = client.embeddings.create(model="gemma3-270m", encoding_format="float", input=[
        "The cat sat on the mat.", "A kitten rests on the rug.", "Stock markets fell sharply today."]).data
    cat, kitten, stocks = (vec(row) for row in rows)
    assert float(cat @ kitten) > float(cat @ stocks) + 0.1
    assert float(cat @ kitten) > float(kitten @ stocks) + 0.1


def test_deterministic_across_batches_and_an_l1_repeat_computes_nothing(client, node):
    text = "Determinism: this sentence is embedded twice."
    engine = node.state.engine
    tokens = engine.tokenize(text, add_bos=True, special=False)
    alone = engine.embed([tokens]).result(60)[0]  # the engine itself: no cache in between
    others = [engine.tokenize(t, add_bos=True, special=False) for t in ("Other words.", "And more, longer, words.")]
    decodes = settled(node)["embedding_decodes"]
    beside = engine.embed([others[0], tokens, others[1]]).result(60)[1]
    assert engine.stats()["embedding_decodes"] == decodes + 1  # three inputs, one llama_decode
    assert float(alone @ beside) / float(np.linalg.norm(alone) * np.linalg.norm(beside)) > 0.9999

    first = client.embeddings.with_raw_response.create(model="gemma3-270m", input=text, encoding_format="float")
    node.call(node.state.service.drain())
    computed = settled(node)["embedding_tokens"]
    hits = metric(node.url, "reame_embedding_inputs_total", headers=AUTH, cache="hit")
    second = client.embeddings.with_raw_response.create(model="gemma3-270m", input=text, encoding_format="float")
    assert first.headers["X-Reame-Cache"] == "miss" and second.headers["X-Reame-Cache"] == "hit"
    assert np.array_equal(vec(first.parse().data[0]), vec(second.parse().data[0]))
    assert second.parse().usage.prompt_tokens == len(tokens)
    assert settled(node)["embedding_tokens"] == computed  # the repeat decoded no token
    assert metric(node.url, "reame_embedding_inputs_total", headers=AUTH, cache="hit") == hits + 1


def test_embeddings_beside_a_streaming_chat_both_finish(client, node):
    chat_text: list[str] = []

    def chat() -> None:
        stream = client.chat.completions.create(model="gemma3-270m", max_tokens=24, temperature=0.7, stream=True,
                                                messages=[{"role": "user", "content": "Tell a short story."}])
        chat_text.extend(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    thread = threading.Thread(target=chat)
    thread.start()
    results = [client.embeddings.create(model="gemma3-270m", encoding_format="float",
                                        input=[f"Composition input {i} of {n}." for i in range(4)])
               for n in range(3)]
    thread.join(120)
    assert not thread.is_alive() and "".join(chat_text)
    assert all(len(r.data) == 4 for r in results)


def test_langchain_openai_embeddings(node):
    langchain_openai = pytest.importorskip("langchain_openai")
    # check_embedding_ctx_length=False: otherwise LangChain sends tiktoken ids of OpenAI's vocabulary
    embedder = langchain_openai.OpenAIEmbeddings(model="gemma3-270m", base_url=f"{node.url}/v1", api_key=KEY,
                                                 check_embedding_ctx_length=False, max_retries=0)
    docs = embedder.embed_documents(["The cat sat on the mat.", "Stock markets fell sharply today."])
    query = embedder.embed_query("A kitten rests on the rug.")
    assert len(docs) == 2 and len(docs[0]) == len(query) == 640
    d = np.asarray(docs, dtype=np.float32)
    q = np.asarray(query, dtype=np.float32)
    assert float(d[0] @ q) > float(d[1] @ q)


def test_clear_400s_and_the_key(client, node):
    def refused(body: dict) -> dict:
        status, _, reply = http_json("POST", f"{node.url}/v1/embeddings", body, AUTH)
        assert status == 400, reply
        return reply["error"]

    assert refused({"input": "word " * 200})["code"] == "context_length_exceeded"  # over batch_tokens = 128
    assert "max_inputs" in refused({"input": ["x"] * 301})["message"]
    assert "max_request_tokens" in refused({"input": ["word " * 100] * 50})["message"]
    assert refused({"input": ""})["param"] == "input"
    assert refused({"input": []})["param"] == "input"
    assert refused({"input": [[1, 2], []]})["param"] == "input"
    assert refused({"input": [300_000]})["param"] == "input"  # outside the 262,144-token vocabulary
    assert refused({"input": [1.5]})["param"] == "input"
    assert refused({"input": "x", "encoding_format": "int8"})["param"] == "encoding_format"
    assert refused({"input": "x", "dimensions": "64"})["param"] == "dimensions"
    status, _, reply = http_json("POST", f"{node.url}/v1/embeddings", {"input": "x", "model": "gpt-4"}, AUTH)
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    ok, _, _ = http_json("POST", f"{node.url}/v1/embeddings", {"input": "x", "user": "someone"}, AUTH)
    assert ok == 200
    status, _, _ = http_json("POST", f"{node.url}/v1/embeddings", {"input": "x"})
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{node.url}/v1", api_key="wrong", max_retries=0).embeddings.create(
            model="gemma3-270m", input="x")
