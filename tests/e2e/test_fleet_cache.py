"""The prefix cache across the fleet: two nodes and `reame warm` sharing one real `reame arca`.

Node A warms a document through its HTTP API and pushes the state to ARCA's L3; node B, with
an empty cache directory of its own, answers a question about that document by fetching the
state from ARCA instead of prefilling it (its /metrics show the L3 hit and the restored
tokens). `reame warm --arca` does the same for a document from the command line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import free_port
from tests.e2e.test_fleet import ROOT, Arca
from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.node.api.test_cache_api import DOC, RESTORED

pytestmark = [pytest.mark.model, pytest.mark.slow]
OTHER_DOC = " ".join(f"Crate {i} weighs {i * 7 + 2} kilograms and holds {('bolts', 'nails', 'rivets')[i % 3]}."
                     for i in range(40))


@pytest.fixture(scope="module")
def fleet(gemma_path, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    base = tmp_path_factory.mktemp("fleet-cache")
    arca = Arca(base / "arca", free_port(), base / "arca.log")
    arca.start()
    nodes = []
    try:
        for name in ("a", "b"):
            home = base / name
            settings = node_settings(gemma_path, home, **{
                "model.threads": 1, "cache.enabled": True, "cache.directory": str(home / "kv"),
                "arca.remote": f"127.0.0.1:{arca.port}", "arca.observe": False, "arca.timeout_ms": 10000})  # a loaded 2-core host can take seconds per fetch
            nodes.append(LiveNode(settings).start())
        yield arca, nodes
    finally:
        for node in nodes:
            node.stop()
        arca.kill()


def ask(node, doc: str, question: str) -> dict:
    status, _, body = http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": [{"role": "system", "content": doc}, {"role": "user", "content": question}],
        "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    return body


def test_node_b_restores_what_node_a_warmed(fleet):
    _, (node_a, node_b) = fleet
    status, _, warmed = http_json("POST", f"{node_a.url}/v1/warm", {"messages": [{"role": "system", "content": DOC}]})
    assert status == 200 and warmed["stored_tokens"] > 0
    node_a.call(node_a.state.service.fleet.drain())
    assert metric(node_a.url, "reame_prefix_cache_fleet_pushes_total") == 1
    assert http_json("GET", f"{node_b.url}/health")[2]["cache"]["fleet"] == "on"

    ask(node_b, DOC, "Which jam is on shelf 9?")
    assert metric(node_b.url, "reame_prefix_cache_hits_total", tier="fleet") == 1
    assert metric(node_b.url, RESTORED) == warmed["stored_tokens"]
    assert metric(node_b.url, "reame_prefix_cache_fetched_bytes_total") > 0


def test_reame_warm_pushes_a_document_to_the_fleet(fleet, tmp_path, gemma_path):
    arca, (_, node_b) = fleet
    document = tmp_path / "crates.txt"
    document.write_text(OTHER_DOC, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "warm", str(document), "--model", str(gemma_path), "--threads", "1",
         "--ctx", "2048", "--arca", f"127.0.0.1:{arca.port}"],
        cwd=ROOT, env={"REAME_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"{document}: " in result.stdout and "pushed 1 states" in result.stdout
    assert list((tmp_path / "home" / "cache").rglob("*.kvs")), "the state is on the local disk too"

    before = metric(node_b.url, RESTORED)
    ask(node_b, OTHER_DOC, "What does crate 4 hold?")
    assert metric(node_b.url, "reame_prefix_cache_hits_total", tier="fleet") == 2
    assert metric(node_b.url, RESTORED) > before
