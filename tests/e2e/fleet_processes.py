"""The fleet of docker-compose.yml as plain processes on loopback, for tests and bench/fleet.py.

`FleetProcesses` starts a real `reame arca` (with a password), `reame run --serve` nodes
pointed at it (with a bearer key, the prefix cache on, KV type fixed as the compose file
fixes it) and HAProxy from the very config the balancer image carries
(deploy/haproxy/haproxy.cfg, addresses from the environment). Every process writes its log
under the base directory; `stop()` ends them with SIGTERM (SIGKILL after 30 s).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.conftest import free_port
from tests.e2e.test_fleet import ROOT, reame, wait_for
from tests.node.api.live import http_json, metric

HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
PASSWORD = "fleet-arca-secret"
API_KEY = "fleet-node-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)


@dataclass
class FleetProcesses:
    base: Path
    model: Path
    ctx: int = 2048  # two sequences of 1024: the shared test document is ~530 tokens
    parallel: int = 2
    threads: int = 1
    node_env: dict[str, str] = field(default_factory=dict)
    arca_port: int = 0
    nodes: dict[str, str] = field(default_factory=dict)  # name -> url
    balancer: str = ""
    processes: list[subprocess.Popen] = field(default_factory=list)
    node_processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    arca_process: subprocess.Popen | None = None

    # ---------------------------------------------------------------- ARCA

    def start_arca(self, directory: Path | None = None) -> None:
        self.arca_port = self.arca_port or free_port()
        directory = directory or self.base / "arca"
        self.arca_process = reame("arca", "--port", str(self.arca_port), "--dir", str(directory),
                                  env={"REAME_ARCA_PASSWORD": PASSWORD}, log=self.base / "arca.log")
        self.processes.append(self.arca_process)
        client = self.redis()

        def answers() -> bool:
            if self.arca_process is not None and self.arca_process.poll() is not None:
                raise AssertionError(f"ARCA exited: {(self.base / 'arca.log').read_text()[-2000:]}")
            try:
                return bool(client.ping())
            except redis.RedisError:  # not listening yet
                return False

        wait_for(answers, 60, "ARCA to answer PING")

    def redis(self) -> redis.Redis:
        return redis.Redis(port=self.arca_port, password=PASSWORD, socket_timeout=2)

    @property
    def arca_address(self) -> str:
        return f"127.0.0.1:{self.arca_port}"

    # ---------------------------------------------------------------- nodes

    def start_node(self, name: str, *, arca: bool = True, remote: str | None = None, wait: bool = True) -> str:
        """A node on this fleet's ARCA; `remote` points it elsewhere instead (a URL without
        the password), `arca=False` gives it its own embedded archive."""
        port = free_port()
        home = self.base / name
        env = {"REAME_HOME": str(home), "REAME_CACHE_ENABLED": "true", "REAME_MEMORY_KV_CACHE_TYPE": "f16",
               "REAME_SPECULATIVE_ENABLED": "false", "REAME_ARCA_TIMEOUT_MS": "2000",
               "REAME_ARCA_PASSWORD": "" if remote else PASSWORD, "REAME_SERVER_API_KEY": API_KEY, **self.node_env}
        args = ["run", str(self.model), "--serve", "--port", str(port), "--ctx", str(self.ctx),
                "--parallel", str(self.parallel), "--threads", str(self.threads)]
        if remote or arca:
            args += ["--arca", remote or self.arca_address]
        self.node_processes[name] = reame(*args, env=env, log=self.base / f"node-{name}.log")
        self.processes.append(self.node_processes[name])
        url = f"http://127.0.0.1:{port}"
        self.nodes[name] = url
        if wait:
            self.wait_node(name)
        return url

    def wait_node(self, name: str) -> None:
        url, process = self.nodes[name], self.node_processes[name]

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"node {name} exited: {(self.base / f'node-{name}.log').read_text()[-2000:]}")
            return http_json("GET", f"{url}/health", timeout=2)[0] == 200

        wait_for(up, 180, f"node {name} at {url}")

    # ---------------------------------------------------------------- the balancer

    def start_balancer(self, backends: tuple[str, str] = ("a", "b")) -> str:
        """HAProxy in front of the two named nodes (its `node-a` and `node-b`), not any other
        node this fleet runs beside them (a cold node without the archive, say)."""
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError("haproxy is not installed (Debian: apt-get install haproxy)")
        port = free_port()
        first, second = (self.nodes[name].removeprefix("http://") for name in backends)
        env = {**os.environ, "REAME_LB_BIND": f"127.0.0.1:{port}", "REAME_NODE_A": first, "REAME_NODE_B": second}
        log = open(self.base / "haproxy.log", "wb")
        self.processes.append(subprocess.Popen([binary, "-W", "-db", "-f", str(HAPROXY_CFG)], env=env,
                                               stdout=log, stderr=subprocess.STDOUT))
        self.balancer = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_json("GET", f"{self.balancer}/health", timeout=2)[0] == 200, 30, "the balancer")
        return self.balancer

    # ---------------------------------------------------------------- asking

    def chat(self, url: str, messages: list[dict[str, str]], *, max_tokens: int = 4,
             **extra: Any) -> tuple[dict[str, str], dict]:
        """(headers with lower-case names, body) of a greedy chat completion."""
        status, headers, body = http_json("POST", f"{url}/v1/chat/completions", {
            "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}, headers=AUTH, timeout=600)
        assert status == 200, body
        return {key.lower(): value for key, value in headers.items()}, body  # HAProxy sends lower case

    def metric(self, url: str, name: str, **labels: str) -> float:
        return metric(url, name, headers=AUTH, **labels)

    def wait_archived(self, count: int) -> None:
        wait_for(lambda: self.redis().dbsize() >= count, 60, f"{count} answers in ARCA")

    def log_tails(self, lines: int = 12) -> str:
        """The last lines of every process's log, for a failure report."""
        out = []
        for path in sorted(self.base.glob("*.log")):
            out.append(f"== {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    # ---------------------------------------------------------------- lifetime

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()

    def __enter__(self) -> "FleetProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
