"""The fleet end to end: a real `reame arca` process and two `reame run --serve` node processes.

A deterministic answer computed by node A is a hit on node B; the finished generation was
observed into ARCA's corpus under the model's fingerprint. Then ARCA is killed mid-run: both
nodes keep answering and /health says degraded. ARCA restarts on the same directory: the
nodes notice, /health says ok, the answer stored before the crash is still a hit, and new
answers are shared again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from tests.conftest import free_port

pytestmark = [pytest.mark.model, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def reame(*args: str, env: dict | None = None, log: Path) -> subprocess.Popen:
    handle = open(log, "wb")
    return subprocess.Popen([sys.executable, "-m", "node.cli", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=handle, stderr=subprocess.STDOUT)


def http(method: str, url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, data=orjson.dumps(body) if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), orjson.loads(exc.read())


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Arca:
    def __init__(self, directory: Path, port: int, log: Path) -> None:
        self.directory, self.port, self.log = directory, port, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = reame("arca", "--port", str(self.port), "--dir", str(self.directory), log=self.log)
        client = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: client.ping(), 30, "ARCA to answer PING")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture(scope="module")
def fleet(gemma_path, tmp_path_factory):
    base = tmp_path_factory.mktemp("fleet")
    arca = Arca(base / "arca", free_port(), base / "arca.log")
    arca.start()
    nodes, processes = [], []
    for name in ("a", "b"):
        port = free_port()
        env = {"REAME_HOME": str(base / name), "REAME_CACHE_ENABLED": "false"}
        processes.append(reame("run", str(gemma_path), "--serve", "--port", str(port), "--ctx", "1024",
                               "--parallel", "2", "--arca", f"127.0.0.1:{arca.port}", env=env,
                               log=base / f"node-{name}.log"))
        nodes.append(f"http://127.0.0.1:{port}")
    try:
        for url in nodes:
            wait_for(lambda: http("GET", f"{url}/health", timeout=2)[0] == 200, 180, f"node {url}")
        yield arca, nodes
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                assert process.wait(30) == 0  # a clean shutdown on SIGTERM
            finally:
                process.kill()
        if arca.process.poll() is None:
            arca.kill()


def ask(url: str, text: str) -> tuple[str, str]:
    status, headers, body = http("POST", f"{url}/v1/chat/completions", {
        "model": "gemma3-270m", "messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0})
    assert status == 200, body
    return headers["X-Reame-Cache"], body["choices"][0]["message"]["content"]


def archived(arca: Arca, count: int) -> bool:
    return redis.Redis(port=arca.port, socket_timeout=1).dbsize() >= count


def health(url: str) -> str:
    return http("GET", f"{url}/health", timeout=5)[2]["archive"]


def test_fleet_shares_answers_and_survives_arca(fleet):
    arca, (node_a, node_b) = fleet
    assert health(node_a) == health(node_b) == "ok"

    cache, first = ask(node_a, "Name a fruit.")
    assert cache == "miss"
    wait_for(lambda: archived(arca, 1), 10, "node A's answer in ARCA")
    assert ask(node_b, "Name a fruit.") == ("hit", first)

    fingerprint = http("GET", f"{node_a}/v1/models")[2]["data"][0]["fingerprint"]
    streams = redis.Redis(port=arca.port).execute_command("ARCA.SINCE", "NS", fingerprint, 0)
    assert streams, "the finished generation was observed into the corpus"

    arca.kill()
    for url in (node_a, node_b):
        cache, text = ask(url, "Name a river.")  # still served, by the model
        assert cache == "miss" and text
    assert health(node_a) == health(node_b) == "degraded"

    arca.start()
    for url in (node_a, node_b):
        wait_for(lambda: health(url) == "ok", 30, f"{url} to see ARCA back")
    assert ask(node_b, "Name a fruit.") == ("hit", first)  # stored before the crash, durable
    cache, animal = ask(node_b, "Name an animal.")
    assert cache == "miss"
    wait_for(lambda: archived(arca, 2), 10, "node B's answer in ARCA")
    assert ask(node_a, "Name an animal.") == ("hit", animal)
