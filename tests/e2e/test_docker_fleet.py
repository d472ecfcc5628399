"""The compose fleet in Docker, opt-in (`make test-docker`, or REAME_TEST_DOCKER=1).

Builds the images from this tree, brings ARCA, two nodes and the balancer up with fresh
secrets, asks through the balancer (the key is required; a question asked twice is a hit,
answered by either node), warms a document with the `warm` service and finds it restored
from L3 by the node that answers, then tears everything down with its volumes.

Needs a Docker engine (DOCKER_HOST or the default socket) and a compose command. Settings:
  REAME_COMPOSE_FILES  compose files, space-separated (default: docker-compose.yml
                       docker-compose.host.yml, host networking with the balancer on :28080)
  REAME_TEST_LB_URL    where the balancer answers (default: from the files chosen)
  REAME_BASE_IMAGE     the images' base (passed to the build; see docs/FLEET.md)
"""

from __future__ import annotations

import os
import secrets
import time

import pytest

from tests.e2e.compose import COMPOSE, HOST_OVERRIDE, ROOT, compose, compose_command
from tests.e2e.test_fleet import wait_for
from tests.node.api.live import http_json, metric
from tests.node.api.test_cache_api import DOC

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("REAME_TEST_DOCKER") != "1", reason="opt-in: REAME_TEST_DOCKER=1 (make test-docker)"),
    pytest.mark.timeout(1800),
]


def say(text: str) -> None:
    print(f"[test-docker {time.strftime('%H:%M:%S')}] {text}", flush=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if compose_command() is None:
        pytest.fail("REAME_TEST_DOCKER=1 but neither `docker compose` nor `docker-compose` is installed")
    names = os.environ.get("REAME_COMPOSE_FILES", f"{COMPOSE.name} {HOST_OVERRIDE.name}").split()
    files = tuple(ROOT / name for name in names)
    default_lb = "http://127.0.0.1:28080" if HOST_OVERRIDE in files else "http://127.0.0.1:8080"
    lb = os.environ.get("REAME_TEST_LB_URL", default_lb)
    warm_dir = tmp_path_factory.mktemp("warm")
    (warm_dir / "shelves.txt").write_text(DOC, encoding="utf-8")
    warm_dir.chmod(0o755)
    api_key = secrets.token_hex(16)
    env = {**os.environ, "REAME_ARCA_PASSWORD": secrets.token_hex(16), "REAME_API_KEY": api_key,
           "REAME_NODE_CONTEXT": "2048", "REAME_NODE_PARALLEL": "2", "REAME_NODE_THREADS": "1",
           "REAME_WARM_DIR": str(warm_dir)}
    project = f"reame-test-{os.getpid()}"
    say(f"compose files: {' '.join(names)}; project {project}; balancer {lb}")
    try:
        started = time.monotonic()
        result = compose(env, "up", "-d", "--build", files=files, project=project, timeout=1500)
        say(f"up in {time.monotonic() - started:.0f} s:\n{result.stderr.strip()}")
        wait_for(lambda: http_json("GET", f"{lb}/health", timeout=3)[0] == 200, 180, "the balancer")
        yield {"lb": lb, "auth": {"Authorization": f"Bearer {api_key}"}, "env": env, "files": files,
               "project": project}
    finally:
        logs = compose(env, "logs", "--no-color", "--tail", "5", files=files, project=project, check=False)
        say(f"last log lines:\n{logs.stdout.strip()}")
        down = compose(env, "down", "-v", "--remove-orphans", files=files, project=project, timeout=300, check=False)
        say(f"down (exit {down.returncode}):\n{down.stderr.strip()}")


def chat(fleet, messages: list[dict[str, str]]) -> tuple[dict[str, str], dict]:
    status, headers, body = http_json("POST", f"{fleet['lb']}/v1/chat/completions", {
        "messages": messages, "max_tokens": 6, "temperature": 0}, headers=fleet["auth"])
    assert status == 200, body
    return {key.lower(): value for key, value in headers.items()}, body


def test_asking_through_the_balancer(fleet):
    assert http_json("GET", f"{fleet['lb']}/health")[0] == 200
    assert http_json("GET", f"{fleet['lb']}/v1/models")[0] == 401
    question = [{"role": "user", "content": "Name a city by a river."}]
    headers, first = chat(fleet, question)
    say(f"first ask: {headers['x-reame-cache']} from {headers['x-reame-node']}, "
        f"{first['choices'][0]['message']['content']!r}")
    assert headers["x-reame-cache"] == "miss"
    answered = set()

    def hit() -> bool:
        again, body = chat(fleet, question)
        assert body["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        answered.add(again["x-reame-node"])
        return again["x-reame-cache"] == "hit"

    wait_for(hit, 20, "the answer to be an L1 hit")
    for _ in range(3):
        assert hit()
    say(f"asked again: hits from {sorted(answered)}")
    assert answered == {"node-a", "node-b"}


def test_a_document_warmed_by_the_warm_service_is_restored_from_l3(fleet):
    result = compose(fleet["env"], "run", "--rm", "-T", "warm", files=fleet["files"], project=fleet["project"], timeout=600)
    say(f"reame warm (the warm service): {result.stdout.strip()}")
    assert "pushed 1 states" in result.stdout
    headers, _ = chat(fleet, [{"role": "system", "content": DOC}, {"role": "user", "content": "Which jam is on shelf 9?"}])
    node = headers["x-reame-node"]
    port = "28081" if node == "node-a" else "28082"
    if HOST_OVERRIDE in fleet["files"]:  # the nodes listen on loopback: read the answering node's metrics
        fetched = metric(f"http://127.0.0.1:{port}", "reame_prefix_cache_hits_total", headers=fleet["auth"], tier="fleet")
        say(f"{node} restored the warmed document from ARCA's L3: fleet hits {fetched:.0f}")
        assert fetched == 1
