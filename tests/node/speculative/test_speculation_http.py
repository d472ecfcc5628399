"""Speculation through a live node: on by default, visible in /health and /metrics per source,
switched off per request by `"speculation": false` without changing the answer or its L1 key,
and composing with chat sessions (their stored prompt + answer KV)."""

from __future__ import annotations

import pytest

from tests.node.api.live import drafting_node, http_json, metric, node_settings

pytestmark = [pytest.mark.model]
COPY = ("Copy the list exactly.\nList: red apple, green pear, yellow lemon, purple plum, orange peach, "
        "white grape, black cherry.\nCopy: red apple, green pear,")


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    """The loader's engine and controller, with a fixed cost line so choices do not depend on the load."""
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{"cache.enabled": True})
    with drafting_node(settings) as live:
        assert live.state.speculation.source_names[:4] == ("lookup", "sibling", "archive", "grammar")
        yield live


def complete(node, max_tokens: int, **extra):
    status, headers, body = http_json("POST", f"{node.url}/v1/completions", {
        "prompt": COPY, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert status == 200, body
    return headers["X-Reame-Cache"], body["choices"][0]["text"]


def test_speculation_is_on_visible_and_off_per_request_with_the_same_answer(node):
    status, _, health = http_json("GET", f"{node.url}/health")
    assert status == 200 and health["speculation"]["enabled"]
    assert {"lookup", "archive", "grammar", "form.list"} <= set(health["speculation"]["sources"])

    cache, plain = complete(node, 20, speculation=False)
    assert cache == "miss"
    assert metric(node.url, "reame_speculation_drafted_tokens_total", source="lookup") == 0
    cache, again = complete(node, 20)  # speculation is not in the L1 key: the same stored answer
    assert cache == "hit" and again == plain
    cache, longer = complete(node, 28)
    assert cache == "miss" and longer.startswith(plain)
    status, _, health = http_json("GET", f"{node.url}/health")
    sources = ("lookup", "archive")  # the plain answer is in the corpus already: either may draft it
    kept = sum(metric(node.url, "reame_speculation_accepted_tokens_total", source=s) for s in sources)
    assert kept > 0, health["speculation"]
    assert sum(metric(node.url, "reame_speculation_accepted_length_count", source=s) for s in sources) > 0
    assert metric(node.url, "reame_speculation_source_on", source="lookup") == 1
    assert sum(health["speculation"]["sources"][s]["accepted"] for s in sources) == kept
    planner = health["speculation"]["planner"]
    assert set(planner) == {"steps_rested", "quiet_plans", "rest_steps_left"}
    assert all(isinstance(v, int) and v >= 0 for v in planner.values())


def test_a_session_turn_answers_the_same_with_speculation_on_and_off(node):
    answers = []
    for flag in (True, False):
        status, _, session = http_json("POST", f"{node.url}/v1/sessions")
        assert status == 200
        messages = [{"role": "user", "content": COPY}]
        for _ in range(2):
            status, _, body = http_json("POST", f"{node.url}/v1/chat/completions", {
                "session": session["id"], "messages": messages, "max_tokens": 24, "temperature": 0,
                "speculation": flag})
            assert status == 200, body
            answer = body["choices"][0]["message"]["content"]
            answers.append(answer)
            messages = [{"role": "user", "content": "Once more: " + COPY}]
    assert answers[:2] == answers[2:]


def test_health_shows_what_steps_of_one_to_n_sequences_and_rows_after_a_context_cost(node):
    """`step_cost_line_ms.one_token_each_ms`: the calibrated steps of k sequences with one token
    each, which price a token kept by a sequence that ends before the batch's slowest. (This
    node serves on a fixed curve, never calibrated: the spread is set as a calibration would.)"""
    costs = node.state.speculation.costs
    kept, context = costs.spread, costs.context
    try:
        costs.spread = {1: 0.0125, 2: 0.0272, 3: 0.0288, 4: 0.0298}
        costs.context = {128: 0.00012, 512: 0.0007}
        status, _, health = http_json("GET", f"{node.url}/health")
        assert status == 200
        assert health["speculation"]["step_cost_line_ms"]["one_token_each_ms"] == {
            "1": 12.5, "2": 27.2, "3": 28.8, "4": 29.8}
        # and what a row costs more after so many tokens of its sequence's context
        assert health["speculation"]["step_cost_line_ms"]["row_after_context_ms"] == {"128": 0.12, "512": 0.7}
    finally:
        costs.spread, costs.context = kept, context
