"""Chat sessions through the HTTP API on the real model: a turn's answer KV is stored by the
engine as it finishes (no second prefill of the conversation), and the conversation continues
after a node restart with its history, restoring that KV (prompt and answer) from the prefix
cache on disk; save, load, delete and the 404s of unknown sessions."""

from __future__ import annotations

import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.node.api.test_cache_api import DOC, RESTORED

pytestmark = [pytest.mark.model]
ANSWER_TOKENS = 80  # long enough that the stored conversation holds more than the prompt
BLOCK = 32  # the cache's default block_tokens
PREFILLED = "reame_prefix_cache_tokens_prefilled_total"
LOOKUPS = "reame_prefix_cache_lookups_total"


def test_session_survives_a_restart_and_restores_its_conversation(gemma_path, tmp_path):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    settings = node_settings(gemma_path, tmp_path, **{"model.threads": 1, "cache.enabled": True, "cache.directory": str(tmp_path / "kv"),
                                                      "arca.observe": False})
    with LiveNode(settings) as node:
        status, _, created = http_json("POST", f"{node.url}/v1/sessions")
        assert status == 200 and created["object"] == "session" and created["tokens"] == 0
        sid = created["id"]
        no_end = {str(t): -100 for t in node.state.engine.model_info.eog_tokens}  # the answer runs its length
        first = [{"role": "system", "content": DOC}, {"role": "user", "content": "Describe shelf 2."}]
        status, headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
            "session": sid, "messages": first, "max_tokens": ANSWER_TOKENS, "temperature": 0, "logit_bias": no_end})
        assert status == 200, body
        assert headers["X-Reame-Session"] == sid
        first_prompt = body["usage"]["prompt_tokens"]
        status, _, saved = http_json("POST", f"{node.url}/v1/sessions/{sid}/save")
        assert status == 200 and saved["messages"] == 3
        # the answer's KV was stored as it finished: prompt and answer (all but the last token,
        # never decoded) up to their last whole block, without running the conversation again
        assert first_prompt + ANSWER_TOKENS - BLOCK <= saved["cached_tokens"] <= first_prompt + ANSWER_TOKENS - 1
        assert metric(node.url, LOOKUPS) == 1 and metric(node.url, PREFILLED) == first_prompt

    with LiveNode(settings) as node:  # a restarted node: same home, same cache directory
        status, _, shown = http_json("GET", f"{node.url}/v1/sessions/{sid}")
        assert status == 200 and [m["role"] for m in shown["history"]] == ["system", "user", "assistant"]
        assert shown["tokens"] == saved["tokens"]
        status, headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
            "messages": [{"role": "user", "content": "And shelf 5?"}], "max_tokens": 6, "temperature": 0},
            headers={"X-Reame-Session": sid})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] > saved["tokens"]  # the history is in the prompt
        assert metric(node.url, RESTORED) == saved["cached_tokens"]  # ... and was not prefilled again:
        # only the answer's tail past its last block, the turn's closing and the new message are
        assert metric(node.url, PREFILLED) == body["usage"]["prompt_tokens"] - saved["cached_tokens"]
        assert saved["tokens"] - saved["cached_tokens"] < BLOCK + 8
        assert metric(node.url, "reame_prefix_cache_disk_preloads_total") == 1

        status, _, loaded = http_json("POST", f"{node.url}/v1/sessions/{sid}/load")
        assert status == 200 and loaded["messages"] == 5 and loaded["cached_tokens"] > 0

        status, _, _ = http_json("DELETE", f"{node.url}/v1/sessions/{sid}")
        assert status == 200
        for method, path, body in (("GET", f"/v1/sessions/{sid}", None), ("POST", f"/v1/sessions/{sid}/load", None),
                                   ("DELETE", "/v1/sessions/sess_nope", None),
                                   ("POST", "/v1/chat/completions",
                                    {"session": sid, "messages": [{"role": "user", "content": "hi"}]})):
            status, _, error = http_json(method, f"{node.url}{path}", body)
            assert status == 404, (path, error)
            assert error["error"]["code"] == "session_not_found"
        status, _, error = http_json("POST", f"{node.url}/v1/chat/completions",
                                     {"session": 7, "messages": [{"role": "user", "content": "hi"}]})
        assert status == 400 and error["error"]["param"] == "session"
