"""The HTTP layer on the fake engine (tests/node/fake_engine.py): the real app on a real
loopback socket, without a model, so every error path and header is checked in a second.

The fake answers deterministically and can be told to refuse submits or to fail in the
middle of a generation, which the real model cannot be made to do on demand. What the
model's answers look like over HTTP is tested on Gemma in test_http.py and its neighbours.
"""

from __future__ import annotations

import urllib.request

import pytest

from node.engine import errors as engine_errors
from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.node.fake_engine import FakeEngine

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "temperature": 0}
KEY = "fake-key"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")


@pytest.fixture(scope="module")
def node(fake, tmp_path_factory):
    settings = node_settings(fake.config.model_path, tmp_path_factory.mktemp("home"), **{"arca.observe": False})
    with LiveNode(settings, engine=fake) as live:
        yield live


@pytest.fixture(autouse=True)
def reset(fake):
    yield
    fake.refuse = fake.fail_after = None


def post(node, path, body, headers=None):
    return http_json("POST", f"{node.url}{path}", body, headers)


def assert_error(body, kind, code, param=None):
    assert set(body["error"]) == {"message", "type", "code", "param"} and body["error"]["message"]
    assert (body["error"]["type"], body["error"]["code"], body["error"]["param"]) == (kind, code, param)


def test_a_chat_answer_then_its_l1_hit(node, fake):
    body = {**CHAT, "messages": [{"role": "user", "content": "cache me"}]}
    status, headers, first = post(node, "/v1/chat/completions", body)
    assert status == 200 and headers["X-Reame-Cache"] == "miss"
    assert first["choices"][0]["message"]["content"].startswith("Fake answer to")
    assert first["choices"][0]["finish_reason"] == "stop" and first["model"] == "fake"
    node.call(node.state.service.drain())
    submitted = len(fake.submitted)
    status, headers, again = post(node, "/v1/chat/completions", body)
    assert status == 200 and headers["X-Reame-Cache"] == "hit" and len(fake.submitted) == submitted
    assert again["choices"] == first["choices"]
    tokens = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [again["usage"][k] for k in tokens] == [first["usage"][k] for k in tokens]
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": first["usage"]["prompt_tokens"]}  # L1
    assert metric(node.url, "reame_archive_hits_total") >= 1


@pytest.mark.parametrize("error, status, kind, code, retry", [
    (engine_errors.EngineOverloaded("full"), 503, "server_error", "overloaded", "1"),
    (engine_errors.EngineClosed("closing"), 503, "server_error", "overloaded", "5"),
    (engine_errors.InvalidRequest("the grammar does not parse as GBNF"), 400, "invalid_request_error", None, None),
])
def test_engine_refusals_are_typed_http_errors(node, fake, error, status, kind, code, retry):
    fake.refuse = error
    got, headers, body = post(node, "/v1/chat/completions", {**CHAT, "temperature": 0.5})
    assert got == status
    assert_error(body, kind, code)
    assert headers.get("Retry-After") == retry


def test_too_long_is_context_length_exceeded(node):
    status, _, body = post(node, "/v1/completions", {"prompt": "x", "max_tokens": 5000})
    assert status == 400
    assert_error(body, "invalid_request_error", "context_length_exceeded", "max_tokens")


def test_a_failure_before_the_stream_starts_is_a_500(node, fake):
    fake.fail_after = 2
    status, _, body = post(node, "/v1/chat/completions", {**CHAT, "temperature": 0.5})
    assert status == 500
    assert_error(body, "server_error", "internal_error")


def test_a_failure_after_the_stream_started_is_an_sse_error_event(node, fake):
    fake.fail_after = 3
    request = urllib.request.Request(f"{node.url}/v1/chat/completions", method="POST",
                                     data=b'{"messages": [{"role": "user", "content": "s"}], "stream": true, '
                                          b'"temperature": 0.5}', headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        raw = response.read().decode()
    frames = raw.split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    error = frames[-3]
    assert error.startswith("event: error\ndata: ") and '"code":"internal_error"' in error


def test_routing_errors_and_the_model_name(node):
    status, _, body = http_json("GET", f"{node.url}/v1/nowhere")
    assert status == 404
    assert_error(body, "invalid_request_error", "not_found")
    status, headers, body = http_json("GET", f"{node.url}/v1/chat/completions")
    assert status == 405 and "POST" in headers["Allow"]
    assert_error(body, "invalid_request_error", "method_not_allowed")
    status, _, body = post(node, "/v1/chat/completions", {**CHAT, "model": "not-this-one"})
    assert status == 404
    assert_error(body, "invalid_request_error", "model_not_found", "model")
    status, _, body = post(node, "/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert status == 400
    assert_error(body, "invalid_request_error", "unsupported_feature", "tools")


def test_sessions_over_http(node):
    status, _, created = post(node, "/v1/sessions", None)
    assert status == 200
    sid = created["id"]
    status, headers, _ = post(node, "/v1/chat/completions", CHAT, {"X-Reame-Session": sid})
    assert status == 200 and headers["X-Reame-Session"] == sid
    status, _, shown = http_json("GET", f"{node.url}/v1/sessions/{sid}")
    assert [m["role"] for m in shown["history"]] == ["user", "assistant"] and shown["tokens"] > 0
    status, _, body = post(node, "/v1/warm", {"prompt": "doc"})
    assert status == 400 and body["error"]["code"] == "cache_disabled"
    status, _, body = http_json("DELETE", f"{node.url}/v1/sessions/{sid}")
    assert status == 200 and body["deleted"] is True
    status, _, body = post(node, "/v1/chat/completions", {**CHAT, "session": sid})
    assert status == 404
    assert_error(body, "invalid_request_error", "session_not_found", "session")


def test_the_api_key_is_checked(fake, tmp_path):
    settings = node_settings(fake.config.model_path, tmp_path, **{"server.api_key": KEY})
    with LiveNode(settings, engine=fake) as keyed:
        status, headers, body = post(keyed, "/v1/chat/completions", CHAT)
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert_error(body, "authentication_error", "invalid_api_key")
        status, _, _ = post(keyed, "/v1/chat/completions", CHAT, {"Authorization": f"Bearer {KEY}"})
        assert status == 200
        assert http_json("GET", f"{keyed.url}/health")[0] == 200


def test_embeddings_share_one_computation_per_distinct_input_and_repeat_from_l1(node, fake):
    body = {"input": ["fake embed a", "fake embed b", "fake embed a"], "encoding_format": "float"}
    status, headers, first = post(node, "/v1/embeddings", body)
    assert status == 200 and headers["X-Reame-Cache"] == "miss"
    assert fake.embedded[-2:] == [tuple(fake.tokenize(t, special=False)) for t in ("fake embed a", "fake embed b")]
    assert first["data"][0]["embedding"] == first["data"][2]["embedding"] != first["data"][1]["embedding"]
    assert first["usage"] == {"prompt_tokens": 3 * 13, "total_tokens": 3 * 13}
    node.call(node.state.service.drain())
    computed = len(fake.embedded)
    status, headers, again = post(node, "/v1/embeddings", {**body, "input": body["input"][::-1]})
    assert status == 200 and headers["X-Reame-Cache"] == "hit" and len(fake.embedded) == computed
    assert [d["embedding"] for d in again["data"]] == [d["embedding"] for d in first["data"]][::-1]
    fake.refuse = engine_errors.EngineOverloaded("full")
    status, _, reply = post(node, "/v1/embeddings", {"input": "fake embed, not cached"})
    assert status == 503 and reply["error"]["code"] == "overloaded"
