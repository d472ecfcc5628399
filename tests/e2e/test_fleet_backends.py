"""Two nodes on the real model sharing one archive of each kind: a plain redis-server, the same
over TLS with a password, a real Redis Cluster, and an ARCA over TLS.

In each case node B answers node A's deterministic request from L1, restores the KV state of
a document node A warmed (L3), receives node A's generation into its Palimpsest through the
L4 mirror, and continues a chat session node A started. Then a cluster master is killed while
requests are in flight: every answer still comes, and once the replica has taken over the
nodes share again.

The two engines (the model, its prefix cache, the speculation controller) are opened once for
the module; each backend gets two fresh nodes on them, with documents and questions of its own
so nothing a previous backend left in an engine's cache can answer for it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from arca.launch import free_port
from arca.tls import server_context
from tests.arca.arca_harness import start_server
from tests.certs import make_certs
from tests.node.api.live import LiveNode, http_json, metric, node_settings
from tests.redis_servers import RedisCluster, RedisServer, needs_redis, wait_for

pytestmark = [pytest.mark.model, pytest.mark.slow, needs_redis]
PASSWORD = "fleet-secret"
FLEET_HITS = "reame_prefix_cache_hits_total"


@dataclass
class Backend:
    name: str
    remote: str
    tls: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("fleet-certs"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory, certs):
    """Every kind of archive server, started once."""
    base = tmp_path_factory.mktemp("fleet-backends")
    plain = RedisServer(base / "plain").start()
    secure = RedisServer(base / "tls", tls=certs, password=PASSWORD).start()
    cluster = RedisCluster(base / "cluster")
    context = server_context(str(certs.server_cert), str(certs.server_key), str(certs.ca), "yes")
    arca = start_server(base / "arca", tls_port=free_port(), tls_context=context, requirepass=PASSWORD)
    try:
        cluster.start()
        client_files = {"arca.tls_ca_cert_file": str(certs.ca), "arca.tls_cert_file": str(certs.client_cert),
                        "arca.tls_key_file": str(certs.client_key)}
        yield {
            "redis": Backend("redis", f"redis://127.0.0.1:{plain.port}"),
            "redis-tls": Backend("redis-tls", f"rediss://default:{PASSWORD}@127.0.0.1:{secure.port}", client_files),
            "cluster": Backend("cluster", cluster.url()),
            "arca-tls": Backend("arca-tls", f"rediss://:{PASSWORD}@127.0.0.1:{arca.state.tls_port}", client_files),
        }, cluster
    finally:
        cluster.stop()
        arca.stop()
        secure.kill()
        plain.kill()


def settings_for(gemma_path: Path, home: Path, backend: Backend | None):
    flags = {"model.threads": 1, "model.context_length": 1024, "server.parallel": 2, "cache.enabled": True,
             "cache.directory": str(home / "kv"), "arca.timeout_ms": 2000}
    if backend is not None:
        flags.update({"arca.remote": backend.remote, **backend.tls})
    return node_settings(gemma_path, home, **flags)


@pytest.fixture(scope="module")
def engines(gemma_path, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    from node.assembly import open_engine

    base = tmp_path_factory.mktemp("fleet-engines")
    opened = [open_engine(settings_for(gemma_path, base / name, None), progress=False) for name in ("a", "b")]
    yield opened
    for engine in opened:
        engine.close()
        cache = engine.config.prefix_cache
        if cache is not None:
            cache.close()


class Pair:
    def __init__(self, gemma_path: Path, base: Path, engines, backend: Backend) -> None:
        self.nodes = [LiveNode(settings_for(gemma_path, base / f"{backend.name}-{name}", backend), engine=engine)
                      for name, engine in zip("ab", engines)]

    def __enter__(self) -> tuple[LiveNode, LiveNode]:
        for node in self.nodes:
            node.start()
        return self.nodes[0], self.nodes[1]

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:
            node.stop()


def chat(node: LiveNode, messages: list[dict], max_tokens: int = 4, **extra) -> tuple[str, str, dict]:
    status, headers, body = http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert status == 200, body
    return headers.get("X-Reame-Cache", ""), body["choices"][0]["message"]["content"], body


def palimpsest_size(node: LiveNode) -> int:
    stats = node.state.speculation.source("archive").stats()
    return stats.streams + stats.pending


def document(name: str) -> str:
    return " ".join(f"Depot {name} bay {i} stores {i * 5 + 3} crates of {('tin', 'salt', 'rope', 'wax')[i % 4]}."
                    for i in range(8))


@pytest.mark.parametrize("kind", ["redis", "redis-tls", "cluster", "arca-tls"])
def test_two_nodes_share_every_tier(kind, servers, engines, gemma_path, tmp_path):
    backend = servers[0][kind]
    with Pair(gemma_path, tmp_path, engines, backend) as (node_a, node_b):
        for node in (node_a, node_b):
            health = http_json("GET", f"{node.url}/health")[2]
            assert health["archive"] == "ok", health
            assert health["archive_kind"] == ("arca" if kind.startswith("arca") else "redis")

        # L4 and L1: node A's generation reaches node B's Palimpsest through the mirror, and
        # node B answers the same request from L1
        before = palimpsest_size(node_b)
        question = [{"role": "user", "content": f"Name a colour ({kind})."}]
        cache, first, _ = chat(node_a, question)
        assert cache == "miss"
        node_a.call(node_a.state.service.drain())
        wait_for(lambda: palimpsest_size(node_b) > before, 20, "node A's generation in node B's Palimpsest")
        assert chat(node_b, question)[:2] == ("hit", first)

        # L3: node B restores the state of a document node A warmed
        doc = document(kind)
        status, _, warmed = http_json("POST", f"{node_a.url}/v1/warm", {"messages": [{"role": "system", "content": doc}]})
        assert status == 200 and warmed["stored_tokens"] > 0
        node_a.call(node_a.state.service.fleet.drain())
        hits = metric(node_b.url, FLEET_HITS, tier="fleet")
        chat(node_b, [{"role": "system", "content": doc}, {"role": "user", "content": "Which bay has wax?"}], 1)
        assert metric(node_b.url, FLEET_HITS, tier="fleet") == hits + 1

        # sessions: started on A, continued on B, seen whole from A
        status, _, session = http_json("POST", f"{node_a.url}/v1/sessions", {})
        assert status == 200
        chat(node_a, [{"role": "user", "content": "Say one word."}], 2, session=session["id"])
        chat(node_b, [{"role": "user", "content": "Say another."}], 2, session=session["id"])
        status, _, shown = http_json("GET", f"{node_a.url}/v1/sessions/{session['id']}")
        assert status == 200 and [m["role"] for m in shown["history"]] == ["user", "assistant"] * 2
        assert http_json("GET", f"{node_b.url}/v1/sessions/sess_{'0' * 24}")[0] == 404


def test_a_killed_cluster_master_costs_only_the_speed_up(servers, engines, gemma_path, tmp_path):
    backend, cluster = servers[0]["cluster"], servers[1]
    with Pair(gemma_path, tmp_path, engines, backend) as (node_a, node_b):
        questions = [[{"role": "user", "content": f"Count to {n}."}] for n in range(2, 8)]
        with ThreadPoolExecutor(4) as pool:
            running = [pool.submit(chat, node, q) for node, q in zip((node_a, node_b) * 2, questions[:4])]
            cluster.masters[0].kill()  # while those requests run
            answers = [future.result() for future in running]
        answers += [chat(node_a, q) for q in questions[4:]]
        assert all(text for _, text, _ in answers)  # every answer came, from the model or L1
        for node in (node_a, node_b):
            assert http_json("GET", f"{node.url}/health")[2]["archive"] in ("ok", "degraded")

        cluster.wait_failover()
        for node in (node_a, node_b):
            wait_for(lambda: http_json("GET", f"{node.url}/health")[2]["archive"] == "ok", 30,
                     f"{node.url} to follow the failover")
        later = [{"role": "user", "content": "Name a planet."}]
        cache, text, _ = chat(node_a, later)
        node_a.call(node_a.state.service.drain())
        assert chat(node_b, later)[:2] == ("hit", text)  # sharing again after the failover
