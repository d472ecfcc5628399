"""Soak: ARCA and a node under mixed load for a long run, with ARCA killed and restarted once.

    .venv/bin/python bench/soak.py [--minutes 20] [--model PATH] [--clients 3]

One `reame arca` (durable `commit` mode) and one node pointed at it (`[arca] remote`, prefix
cache on, so L1, L3 and L4 all travel to ARCA). For the whole run, at once:
- RESP writers: SET over a bounded keyspace (each key owned by one writer, so the last
  acknowledged value is known), GET of acknowledged keys checked against it, ARCA.OBSERVE
  of token streams (their ids kept), ARCA.KVPUT of blobs derived from their key;
- HTTP clients: greedy chat (a third repeat an earlier question: L1 hits), sampled chat,
  streamed chat, completions, and streams the client abandons after the first chunk.
At 15% of the run ARCA gets SIGKILL and is started again on the same directory and port;
RESP errors while it is down are expected and counted apart (a write that failed was never
acknowledged; a SET in flight at the kill may have landed either way, so both values are
accepted for that key). The node must keep answering throughout (a down ARCA is a miss).

At the end: the node's engine back at idle (bench/stream_load.py: every slot free, nothing
active or queued, KV cells used and reserved as before the load), every acknowledged SET value, OBSERVE stream and KVPUT blob is read back; RSS
of both processes and the disk they use are sampled every 15 s, and after warm-up (the
first 30% of the run) each must stay flat: RSS within max(10%, 24 MiB) of its level at the
end of warm-up, disk (the SQLite WAL aside) within 16 MiB, and the WAL under its documented
bound (128 MiB plus one commit) throughout. ARCA runs
with a 2 MB corpus budget and a 64 MB L3 budget, so both fill during warm-up and the run
shows steady state: the oldest corpus streams are evicted first, and every acknowledged
stream from the oldest one still held on must be there. Prints the figures and a verdict line; exits 1 on any unexpected error,
lost write or growth past those bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host import print_header  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from node_process import default_model, node_server  # noqa: E402
from stream_load import IDLE_KEYS, TOPICS, idle_figures, rss_mib, stream_chat, wait_idle  # noqa: E402

from arca.launch import free_port, spawn_arca  # noqa: E402

MIB = 1024 * 1024
KEYS_PER_WRITER = 500
KV_KEYS = 300
KV_BLOB = 32 * 1024
WAL_BOUND_MIB = 128 + 8  # docs/ARCA.md: under 128 MiB plus one commit's writes
CORPUS_MB = 2  # small, so the corpus reaches its budget (and evicts oldest first) during warm-up


@dataclass
class Tally:
    """What happened, by kind; `unexpected` must stay empty."""

    ok: Counter = field(default_factory=Counter)
    expected_errors: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.unexpected) < 50:
            self.unexpected.append(what)
        else:
            self.unexpected[-1] = f"... and more ({what})"


@dataclass
class Arca:
    """The ARCA process, restartable on the same port and directory."""

    directory: Path
    port: int
    process: subprocess.Popen | None = None
    down: bool = False
    up_since: float = 0.0
    restarts: int = 0

    def start(self) -> None:
        conf = self.directory.parent / "arca.conf"
        conf.write_text(f"[storage]\ncorpus-max-mb = {CORPUS_MB}\nkv-max-mb = 64\n")
        self.process, _ = spawn_arca(self.directory, "--max-mb", "256", "--config", str(conf), port=self.port)
        self.down, self.up_since = False, time.monotonic()

    def restarting(self) -> bool:
        """Down, or up again for under 3 s (a connection opened before the kill is broken
        by definition; its first use after the restart fails)."""
        return self.down or (self.restarts > 0 and time.monotonic() - self.up_since < 3.0)

    def kill(self) -> None:
        assert self.process is not None
        self.down = True
        self.restarts += 1
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def kv_blob(key: bytes) -> bytes:
    seed = hashlib.sha256(key).digest()
    return (seed * (KV_BLOB // len(seed) + 1))[:KV_BLOB]


def pack(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


RESP_ERRORS = (aioredis.ConnectionError, aioredis.TimeoutError, ConnectionError, OSError)


async def resp_failed(arca: Arca, tally: Tally, error: Exception) -> None:
    """Count a failed RESP call (expected while ARCA restarts, a failure otherwise), then back off."""
    if arca.restarting():
        tally.expected_errors["RESP while ARCA down"] += 1
    else:
        tally.fail(f"RESP error with ARCA up: {error!r}")
    await asyncio.sleep(0.2)


async def set_writer(arca: Arca, index: int, deadline: float, tally: Tally,
                     accepted: dict[bytes, set[bytes]]) -> None:
    """SET and GET over this writer's own keys; `accepted[key]` holds the values a GET may
    return (the last acknowledged one, plus one in flight when a write failed)."""
    rng = random.Random(index)
    client = aioredis.Redis(port=arca.port, socket_timeout=5, retry_on_timeout=False)
    serial = 0
    try:
        while time.monotonic() < deadline:
            key = f"soak:{index}:{rng.randrange(KEYS_PER_WRITER)}".encode()
            try:
                if key in accepted and rng.random() < 0.5:
                    value = await client.get(key)
                    if value not in accepted[key]:
                        tally.fail(f"GET {key!r} returned a value never acknowledged")
                    else:
                        tally.ok["GET"] += 1
                        accepted[key] = {value}
                else:
                    serial += 1
                    value = f"{index}:{serial}:".encode() + os.urandom(rng.randrange(16, 2048))
                    accepted.setdefault(key, set()).add(value)
                    await client.set(key, value)
                    accepted[key] = {value}
                    tally.ok["SET"] += 1
            except RESP_ERRORS as error:
                await resp_failed(arca, tally, error)
            await asyncio.sleep(0.002)
    finally:
        await client.aclose()


async def corpus_writer(arca: Arca, deadline: float, tally: Tally, streams: dict[int, bytes]) -> None:
    rng = random.Random(99)
    client = aioredis.Redis(port=arca.port, socket_timeout=5)
    try:
        while time.monotonic() < deadline:
            try:
                if rng.random() < 0.7:
                    payload = pack([rng.randrange(262_144) for _ in range(rng.randrange(16, 256))])
                    stream_id = int(await client.execute_command("ARCA.OBSERVE", "NS", "soak", payload))
                    streams[stream_id] = payload
                    tally.ok["OBSERVE"] += 1
                else:
                    key = f"kv:{rng.randrange(KV_KEYS)}".encode()
                    await client.execute_command("ARCA.KVPUT", key, kv_blob(key))
                    got = await client.execute_command("ARCA.KVGET", key)
                    if got is not None and got != kv_blob(key):
                        tally.fail(f"KVGET {key!r} returned other bytes")
                    tally.ok["KVPUT+KVGET"] += 1
            except RESP_ERRORS as error:
                await resp_failed(arca, tally, error)
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


def http_request(rng: random.Random, asked: list[dict], number: int) -> tuple[str, dict, bool]:
    """(path, body, abandon after the first chunk)."""
    kind = rng.choice(["greedy", "greedy", "sampled", "stream", "text", "abandon"])
    question = f"Name {rng.randint(2, 5)} {rng.choice(TOPICS)} ({number})."
    chat = {"model": "gemma3-270m", "messages": [{"role": "user", "content": question}],
            "max_tokens": rng.choice([8, 16, 32])}
    if kind == "greedy":
        body = rng.choice(asked) if asked and rng.random() < 1 / 3 else {**chat, "temperature": 0}
        asked.append(body)
        return "/v1/chat/completions", body, False
    if kind == "sampled":
        return "/v1/chat/completions", {**chat, "temperature": 0.8}, False
    if kind in ("stream", "abandon"):
        return "/v1/chat/completions", {**chat, "temperature": 0.8, "stream": True}, kind == "abandon"
    return "/v1/completions", {"model": "gemma3-270m", "prompt": f"A list of {question}\n1.",
                               "max_tokens": chat["max_tokens"], "temperature": 0}, False


async def http_client(url: str, index: int, deadline: float, tally: Tally) -> None:
    rng = random.Random(1000 + index)
    asked: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=120)
    number = 0
    while time.monotonic() < deadline:
        number += 1
        path, body, abandon = http_request(rng, asked, index * 1_000_000 + number)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                if body.get("stream"):
                    outcome = await stream_chat(session, url, body, abandon)
                    if outcome == "abandoned":
                        tally.ok["abandoned stream"] += 1
                    elif outcome == "done":
                        tally.ok[path + " stream"] += 1
                    else:
                        tally.fail(f"{path}: {outcome}")
                    continue
                async with session.post(url + path, json=body) as response:
                    if response.status != 200:
                        tally.fail(f"{path} -> {response.status}: {(await response.text())[:200]}")
                        continue
                    await response.read()
                    tally.ok[path] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            tally.fail(f"{path}: {error!r}")


def largest_files(*paths: Path, count: int = 5) -> list[tuple[float, str]]:
    sizes = []
    for root in paths:
        for path in root.rglob("*"):
            try:
                if path.is_file():
                    sizes.append((path.stat().st_size / MIB, str(path.relative_to(root.parent))))
            except OSError:
                pass
    return sorted(sizes, reverse=True)[:count]


def disk_mib(*paths: Path, wal: bool = False) -> float:
    """MiB of the files under `paths`: the SQLite WAL alone with `wal`, else all but it."""
    total = 0
    for root in paths:
        for path in root.rglob("*"):
            try:
                if path.is_file() and path.name.endswith("-wal") == wal:
                    total += path.stat().st_size
            except OSError:
                pass
    return total / MIB


async def sampler(arca: Arca, node: subprocess.Popen, paths: tuple[Path, ...], deadline: float,
                  samples: list[tuple[float, float, float, float, float]], start: float) -> None:
    while time.monotonic() < deadline:
        if arca.process is not None and not arca.down and arca.process.poll() is None:
            samples.append((time.monotonic() - start, rss_mib(arca.process.pid), rss_mib(node.pid),
                            disk_mib(*paths), disk_mib(*paths, wal=True)))
        await asyncio.sleep(15)


async def restart_arca(arca: Arca, at: float, tally: Tally) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    arca.kill()
    print(f"  ARCA killed (SIGKILL) at {time.strftime('%H:%M:%S')}", flush=True)
    await asyncio.sleep(2)
    await asyncio.to_thread(arca.start)
    print(f"  ARCA restarted at {time.strftime('%H:%M:%S')}", flush=True)
    tally.ok["ARCA restart"] += 1


async def verify(arca: Arca, accepted: dict[bytes, set[bytes]], streams: dict[int, bytes],
                 tally: Tally) -> dict[str, int]:
    client = aioredis.Redis(port=arca.port, socket_timeout=30)
    lost: Counter = Counter()
    evicted = [0]
    try:
        for key, values in accepted.items():
            if await client.get(key) not in values:
                lost["SET"] += 1
        found: dict[int, bytes] = {}
        cursor = 0
        while True:
            page = await client.execute_command("ARCA.SINCE", "NS", "soak", cursor, "COUNT", 10_000)
            if not page:
                break
            for stream_id, payload in page:
                found[int(stream_id)] = payload
            cursor = int(page[-1][0])
        # The corpus budget evicts the oldest streams first: every acknowledged stream from the
        # oldest one still held on must be there, intact.
        horizon = min(found) if found else max(streams, default=0) + 1
        lost["OBSERVE"] = sum(1 for stream_id, payload in streams.items()
                              if stream_id >= horizon and found.get(stream_id) != payload)
        evicted[0] = sum(1 for stream_id in streams if stream_id < horizon)
        for number in range(KV_KEYS):
            key = f"kv:{number}".encode()
            got = await client.execute_command("ARCA.KVGET", key)
            if got is not None and got != kv_blob(key):
                lost["KVPUT"] += 1
    finally:
        await client.aclose()
    for kind, count in lost.items():
        if count:
            tally.fail(f"{count} acknowledged {kind} writes missing or changed")
    return {"SET keys": len(accepted), "OBSERVE streams": len(streams) - evicted[0],
            "OBSERVE streams evicted by the corpus budget (oldest first)": evicted[0]}


def flatness(samples: list[tuple[float, float, float, float, float]], warmup_s: float) -> list[str]:
    """The growth after warm-up past the bounds in the module docstring (empty = flat)."""
    after = [sample for sample in samples if sample[0] >= warmup_s]
    if len(after) < 2:
        return ["too few samples after warm-up to judge flatness (run longer)"]
    first, problems = after[0], []
    for column, name in ((1, "ARCA RSS"), (2, "node RSS")):
        peak = max(sample[column] for sample in after)
        if peak > first[column] + max(0.10 * first[column], 24):
            problems.append(f"{name} grew {first[column]:.0f} -> {peak:.0f} MiB after warm-up")
    peak_disk = max(sample[3] for sample in after)
    if peak_disk > first[3] + 16:
        problems.append(f"disk (WAL aside) grew {first[3]:.0f} -> {peak_disk:.0f} MiB after warm-up")
    peak_wal = max(sample[4] for sample in samples)
    if peak_wal > WAL_BOUND_MIB:
        problems.append(f"the WAL reached {peak_wal:.0f} MiB, past its documented bound of {WAL_BOUND_MIB} MiB")
    return problems


async def soak(args: argparse.Namespace, model: Path) -> int:
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="reame-soak-") as scratch:
        root = Path(scratch)
        arca = Arca(root / "arca", free_port())
        arca.start()
        (root / "node").mkdir()
        try:
            env = {"REAME_ARCA_REMOTE": f"127.0.0.1:{arca.port}", "REAME_CACHE_ENABLED": "true"}
            with node_server(str(model), ctx=2048, parallel=4, env=env, home=root / "node") as (url, node, home):
                tally, accepted, streams = Tally(), {}, {}
                idle = idle_figures(url)
                samples: list[tuple[float, float, float, float, float]] = []
                start = time.monotonic()
                deadline = start + seconds
                print(f"soak for {args.minutes:g} min: ARCA :{arca.port}, node {url}", flush=True)
                tasks = [set_writer(arca, index, deadline, tally, accepted) for index in range(4)]
                tasks.append(corpus_writer(arca, deadline, tally, streams))
                tasks += [http_client(url, index, deadline, tally) for index in range(args.clients)]
                tasks.append(sampler(arca, node, (arca.directory, home), deadline, samples, start))
                tasks.append(restart_arca(arca, start + 0.15 * seconds, tally))
                await asyncio.gather(*tasks)
                counts = await verify(arca, accepted, streams, tally)
                figures, waited = wait_idle(url, {**idle, "slots_free": idle["slots_total"]})
                print(f"engine {waited:.1f} s after the load: {figures} (at idle before it: {idle})")
                if any(figures[key] != idle[key] for key in IDLE_KEYS if key != "slots_free") \
                        or figures["slots_free"] != figures["slots_total"]:
                    tally.fail(f"the engine did not come back to idle: {figures}, before the load {idle}")
                print("largest files at the end:", ", ".join(
                    f"{name} {size:.1f} MiB" for size, name in largest_files(arca.directory, home)))
                with urllib.request.urlopen(url + "/health", timeout=10) as health:
                    if health.status != 200:
                        tally.fail(f"/health after the run: {health.status}")
        finally:
            arca.stop()
        return report(args, tally, counts, samples, 0.30 * seconds)


def report(args: argparse.Namespace, tally: Tally, counts: dict[str, int],
           samples: list[tuple[float, float, float, float, float]], warmup_s: float) -> int:
    print(f"\nload average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("completed:", ", ".join(f"{kind} {count}" for kind, count in sorted(tally.ok.items())))
    print("expected errors:", dict(tally.expected_errors) or "none")
    print("verified after the run:", ", ".join(f"{kind} {count}" for kind, count in counts.items()),
          "(every acknowledged write read back)")
    print(f"\n{'t (s)':>7} {'ARCA RSS':>9} {'node RSS':>9} {'disk MiB':>9} {'WAL MiB':>8}")
    for t, arca_rss, node_rss, disk, wal in samples:
        mark = " (warm-up)" if t < warmup_s else ""
        print(f"{t:7.0f} {arca_rss:9.1f} {node_rss:9.1f} {disk:9.1f} {wal:8.1f}{mark}")
    problems = flatness(samples, warmup_s)
    for line in tally.unexpected:
        print("UNEXPECTED:", line)
    for line in problems:
        print("GROWTH:", line)
    verdict = not tally.unexpected and not problems
    print(f"\nsoak {'passed' if verdict else 'FAILED'}: {len(tally.unexpected)} unexpected errors, "
          f"{'flat' if not problems else 'growth'} after warm-up")
    return 0 if verdict else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=3, help="concurrent HTTP clients")
    parser.add_argument("--model", type=Path, help="GGUF path (default: the offline gemma3-270m)")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    model = args.model or default_model()
    return asyncio.run(soak(args, model))


if __name__ == "__main__":
    sys.exit(main())
