"""Resident prefixes through the node's HTTP API on the real model: a second question on the
same document continues from the slot the first one left, before the prefix cache is asked;
`usage.prompt_tokens_details.cached_tokens` and /metrics count it, and the cache still stores."""

from __future__ import annotations

import pytest

from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.node.api.test_cache_api import DOC, RESTORED

pytestmark = [pytest.mark.model]


def test_a_second_question_continues_from_the_resident_slot(gemma_path, tmp_path):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    settings = node_settings(gemma_path, tmp_path, **{"model.threads": 1, "cache.enabled": True,
                                                      "cache.directory": str(tmp_path / "kv"), "arca.observe": False})
    with LiveNode(settings) as node:
        def ask(question: str) -> dict:
            status, headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
                "messages": [{"role": "system", "content": DOC}, {"role": "user", "content": question}],
                "max_tokens": 4, "temperature": 0})
            assert status == 200 and headers["X-Reame-Cache"] == "miss", body
            return body["usage"]

        first = ask("Which jam is on shelf 6?")
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(node.url, "reame_prefix_resident_hits_total") == 0
        second = ask("How many jars are on shelf 9?")
        cached = second["prompt_tokens_details"]["cached_tokens"]
        assert second["prompt_tokens"] - 20 < cached < second["prompt_tokens"]  # all but the question
        assert metric(node.url, "reame_prefix_resident_hits_total") == 1
        assert metric(node.url, "reame_prefix_resident_tokens_total") == cached
        assert metric(node.url, RESTORED) == 0  # the slot answered: no tier restored anything
        assert metric(node.url, "reame_prefix_cache_entries", tier="ram") >= 1  # the first prompt was stored
