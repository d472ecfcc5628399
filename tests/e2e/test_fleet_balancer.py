"""docker-compose.yml's topology as plain processes: a real `reame arca` with a password, two
nodes with a bearer key, and HAProxy (deploy/haproxy/haproxy.cfg) in front.

Through the balancer a question asked twice is an L1 hit whichever node answers; a document
warmed through node A is an L3 hit on node B (restored from ARCA, not prefilled); a session
begun on node A continues on node B (sessions live in ARCA, their KV in L3); the balancer
checks the nodes on /health, takes a stopped node out and sends everything to the other. The compose file itself is validated by tests/e2e/test_compose.py.
"""

from __future__ import annotations

import pytest

from tests.e2e.fleet_processes import AUTH, FleetProcesses, haproxy_binary
from tests.e2e.test_fleet import wait_for
from tests.node.api.live import http_json
from tests.node.api.test_cache_api import DOC, RESTORED

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet(gemma_path, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    if haproxy_binary() is None:
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    fleet = FleetProcesses(tmp_path_factory.mktemp("fleet-lb"), gemma_path)
    try:
        fleet.start_arca()
        fleet.start_node("a", wait=False)
        fleet.start_node("b", wait=False)
        for name in fleet.nodes:
            fleet.wait_node(name)
        fleet.start_balancer()
        yield fleet
    finally:
        fleet.stop()


def ask(fleet: FleetProcesses, url: str, question: str) -> tuple[str, str, str]:
    """(X-Reame-Cache, the node HAProxy chose or "", the text)."""
    headers, body = fleet.chat(url, [{"role": "user", "content": question}])
    return headers["x-reame-cache"], headers.get("x-reame-node", ""), body["choices"][0]["message"]["content"]


def test_the_balancer_needs_the_key_but_not_for_health(fleet):
    assert http_json("GET", f"{fleet.balancer}/health")[0] == 200
    assert http_json("GET", f"{fleet.balancer}/v1/models")[0] == 401
    assert http_json("GET", f"{fleet.balancer}/v1/models", headers=AUTH)[0] == 200


def test_a_question_asked_twice_is_a_hit_whichever_node_answers(fleet):
    cache, first_node, text = ask(fleet, fleet.balancer, "Name a colour.")
    assert cache == "miss" and first_node in ("node-a", "node-b")
    fleet.wait_archived(1)
    cache, second_node, again = ask(fleet, fleet.balancer, "Name a colour.")
    assert (cache, again) == ("hit", text)
    answered = {first_node, second_node}
    for _ in range(4):  # idle nodes take turns under leastconn: both answer from ARCA
        if answered == {"node-a", "node-b"}:
            break
        cache, node, again = ask(fleet, fleet.balancer, "Name a colour.")
        assert (cache, again) == ("hit", text)
        answered.add(node)
    assert answered == {"node-a", "node-b"}


def test_a_document_warmed_through_one_node_is_an_l3_hit_on_the_other(fleet):
    node_a, node_b = fleet.nodes["a"], fleet.nodes["b"]
    status, _, warmed = http_json("POST", f"{node_a}/v1/warm", {"messages": [{"role": "system", "content": DOC}]},
                                  headers=AUTH)
    assert status == 200 and warmed["stored_tokens"] > 0
    wait_for(lambda: fleet.metric(node_a, "reame_prefix_cache_fleet_pushes_total") >= 1, 30, "node A's push to L3")

    fleet.chat(node_b, [{"role": "system", "content": DOC}, {"role": "user", "content": "Which jam is on shelf 9?"}])
    assert fleet.metric(node_b, "reame_prefix_cache_hits_total", tier="fleet") == 1
    assert fleet.metric(node_b, RESTORED) == warmed["stored_tokens"]


def test_a_session_continues_on_the_other_node(fleet):
    """Sessions live in ARCA: a turn on node B continues what node A answered, and its KV
    (node A's final state of turn 1) comes from L3 instead of a prefill."""
    node_a, node_b = fleet.nodes["a"], fleet.nodes["b"]
    status, _, session = http_json("POST", f"{node_a}/v1/sessions", {}, headers=AUTH)
    assert status == 200, session
    pushes = fleet.metric(node_a, "reame_prefix_cache_fleet_pushes_total")
    fleet.chat(node_a, [{"role": "user", "content": "My dog is called Biscuit. " + DOC}], session=session["id"])
    wait_for(lambda: fleet.metric(node_a, "reame_prefix_cache_fleet_pushes_total") > pushes, 30, "turn 1's state in L3")

    fleet_hits = fleet.metric(node_b, "reame_prefix_cache_hits_total", tier="fleet")
    headers, _ = fleet.chat(node_b, [{"role": "user", "content": "What is my dog called?"}], session=session["id"])
    assert headers["x-reame-session"] == session["id"]
    assert fleet.metric(node_b, "reame_prefix_cache_hits_total", tier="fleet") == fleet_hits + 1
    for url in (node_a, node_b):
        status, _, shown = http_json("GET", f"{url}/v1/sessions/{session['id']}", headers=AUTH)
        assert status == 200 and shown["messages"] == 4, shown
        assert shown["history"][0]["content"].startswith("My dog is called Biscuit.")
        assert shown["history"][2]["content"] == "What is my dog called?"

    fleet.chat(fleet.balancer, [{"role": "user", "content": "And what colour is he?"}], session=session["id"])
    assert http_json("GET", f"{fleet.balancer}/v1/sessions/{session['id']}", headers=AUTH)[2]["messages"] == 6


def test_a_stopped_node_leaves_the_rotation(fleet):
    """Last: it stops node B. Every request then goes to node A, still answered."""
    process = fleet.node_processes["b"]
    process.terminate()
    assert process.wait(30) == 0
    nodes = set()
    for i in range(4):
        cache, node, text = ask(fleet, fleet.balancer, f"Name a number above {i}.")
        assert text
        nodes.add(node)
    assert nodes == {"node-a"}
