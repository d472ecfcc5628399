"""Real redis-server processes for tests: standalone, TLS, and a Redis Cluster, on 127.0.0.1.

Ports are chosen at run time. Everything is skipped, with the reason, when redis-server or
redis-cli is missing (.ci/run installs both).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.certs import Certs
from tests.conftest import free_port

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                 reason="redis-server / redis-cli not installed (apt-get install redis-server redis-tools)")


def cli(port: int, *args: str, tls: Certs | None = None, password: str | None = None,
        timeout: float = 10) -> subprocess.CompletedProcess:
    command = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
    if tls is not None:
        command += ["--tls", "--cacert", str(tls.ca), "--cert", str(tls.client_cert), "--key", str(tls.client_key)]
    if password:
        command += ["-a", password, "--no-auth-warning"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)


def wait_for(check, timeout: float, what: str) -> None:
    """Poll check() every 0.1 s until it is true; AssertionError naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class RedisServer:
    """One redis-server; `args` are extra settings (`--cluster-enabled yes`, TLS files, ...).

    With `cluster_bus`, the server also listens on a cluster bus port of its own. Ports are
    chosen by the OS a moment before redis-server binds them, so another process can take one
    in between (an outgoing connection's ephemeral port, say): a first start that fails to
    bind picks new ports and tries again."""

    BIND_ATTEMPTS = 5

    def __init__(self, directory: Path, *args: str, tls: Certs | None = None, password: str | None = None,
                 cluster_bus: bool = False) -> None:
        self.directory = directory
        self.cluster_bus = cluster_bus
        self.port, self.bus_port = self._free_ports()
        self.started = False
        self.tls = tls
        self.password = password
        self.args = args
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        command = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", str(self.directory), "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]
        if self.tls is not None:
            command += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.server_cert),
                        "--tls-key-file", str(self.tls.server_key), "--tls-ca-cert-file", str(self.tls.ca),
                        "--tls-auth-clients", "optional"]
        else:
            command += ["--port", str(self.port)]
        if self.password:
            command += ["--requirepass", self.password]
        if self.bus_port is not None:
            command += ["--cluster-port", str(self.bus_port)]
        return [*command, *self.args]

    def _free_ports(self) -> tuple[int, int | None]:
        port = free_port()
        if not self.cluster_bus:
            return port, None
        bus = free_port()
        while bus == port:
            bus = free_port()
        return port, bus

    def start(self) -> "RedisServer":
        """Start and wait for PING; a restart keeps the ports, a first start may move them."""
        for attempt in range(1, self.BIND_ATTEMPTS + 1):
            log = self.directory / "redis.log"
            logged = log.stat().st_size if log.exists() else 0
            self.process = subprocess.Popen(self.command(), stdout=open(log, "ab"), stderr=subprocess.STDOUT)
            if self._answers():
                self.started = True
                return self
            lines = log.read_bytes()[logged:].decode(errors="replace").splitlines()
            if self.started or attempt == self.BIND_ATTEMPTS or not any("Address already in use" in line
                                                                          for line in lines):
                raise RuntimeError("redis-server exited: " + " | ".join(line for line in lines if " # " in line)[-600:])
            self.port, self.bus_port = self._free_ports()
        raise AssertionError("unreachable")

    def _answers(self) -> bool:
        """True once PING answers PONG; False if the process exits first."""
        assert self.process is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if cli(self.port, "ping", tls=self.tls, password=self.password).stdout.strip() == "PONG":
                return True
            time.sleep(0.05)
        self.process.kill()
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def call(self, *args: str) -> str:
        return cli(self.port, *args, tls=self.tls, password=self.password).stdout.strip()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


class RedisCluster:
    """Three masters made into a cluster with `redis-cli --cluster create`, and one replica of
    the first master (so killing it is followed by a failover)."""

    def __init__(self, directory: Path, *, tls: Certs | None = None, password: str | None = None,
                 replica: bool = True) -> None:
        extra = ("--tls-cluster", "yes", "--tls-replication", "yes") if tls is not None else ()
        auth = ("--masterauth", password) if password else ()
        self.tls, self.password = tls, password
        self.nodes = [RedisServer(directory / f"n{i}", "--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                                  "--cluster-config-file", f"nodes-{i}.conf",
                                  "--cluster-require-full-coverage", "no", *extra, *auth, tls=tls, password=password,
                                  cluster_bus=True)
                      for i in range(4 if replica else 3)]

    @property
    def masters(self) -> list[RedisServer]:
        return self.nodes[:3]

    @property
    def replica(self) -> RedisServer:
        return self.nodes[3]

    def url(self, scheme: str = "redis+cluster") -> str:
        return f"{scheme}://" + ",".join(f"127.0.0.1:{node.port}" for node in self.masters)

    def _cli_options(self) -> list[str]:
        options = []
        if self.tls is not None:
            options += ["--tls", "--cacert", str(self.tls.ca), "--cert", str(self.tls.client_cert),
                        "--key", str(self.tls.client_key)]
        if self.password:
            options += ["-a", self.password, "--no-auth-warning"]
        return options

    def start(self) -> "RedisCluster":
        for node in self.nodes:
            node.start()
        created = subprocess.run(["redis-cli", *self._cli_options(), "--cluster", "create",
                                  *(f"127.0.0.1:{n.port}" for n in self.masters), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"cluster create failed: {created.stdout[-2000:]}{created.stderr[-2000:]}")
        if len(self.nodes) == 3:
            self.wait(lambda: all("cluster_state:ok" in n.call("cluster", "info") for n in self.nodes), 30,
                      "the cluster")
            return self
        first_id = self.masters[0].call("cluster", "myid")
        added = subprocess.run(["redis-cli", *self._cli_options(), "--cluster", "add-node",
                                f"127.0.0.1:{self.replica.port}",
                                f"127.0.0.1:{self.masters[0].port}", "--cluster-slave", "--cluster-master-id", first_id],
                               capture_output=True, text=True, timeout=60)
        if added.returncode != 0:
            raise RuntimeError(f"adding the replica failed: {added.stdout[-2000:]}{added.stderr[-2000:]}")
        self.wait(lambda: all("cluster_state:ok" in n.call("cluster", "info") for n in self.nodes)
                  and self.replica.call("role").startswith("slave") and "connected" in self.replica.call("role"),
                  30, "the cluster and its replica")
        return self

    wait = staticmethod(wait_for)

    def master_of(self, key: str) -> RedisServer:
        slot = int(self.masters[1].call("cluster", "keyslot", key))
        for node in self.nodes:
            if node.process is None:
                continue
            for line in node.call("cluster", "nodes").splitlines():
                fields = line.split()
                if "myself" in fields[2] and "master" in fields[2]:
                    for span in fields[8:]:
                        low, _, high = span.partition("-")
                        if low.isdigit() and int(low) <= slot <= int(high or low):
                            return node
        raise AssertionError(f"no master serves slot {slot}")

    def wait_failover(self, timeout: float = 30) -> None:
        self.wait(lambda: self.replica.call("role").startswith("master"), timeout, "the replica to take over")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
