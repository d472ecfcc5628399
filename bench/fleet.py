"""The fleet: node B's first answer on what node A already handled, against a cold node.

    .venv/bin/python bench/fleet.py [--rounds 2] [--lines 56] [--max-tokens 32] [--threads 2] [--model PATH]

Processes as docker-compose.yml lays them out (tests/e2e/fleet_processes.py): a real `reame
arca` with a password, nodes A and B sharing it, HAProxy (deploy/haproxy/haproxy.cfg) in front
of them, and a cold node C with its own embedded archive (the baseline). Each round has a
fresh document (~1,000 tokens by default) and a question about it, asked as a greedy
streamed chat:

  baseline  node C answers it: the whole document is prefilled, the answer decoded;
  ARCA      node A answers it, then node B answers the same request: its first answer on it,
            from ARCA;
  balancer  a second fresh document asked twice through HAProxy: the second ask is timed
            (leastconn sends it to the idle node, the one that did not answer the first);
  L3        node B answers a new question on the round's document: the answer is new
            (decoded), the document's KV state comes from ARCA's L3 instead of a prefill (no
            target; it shows what a question nobody asked yet still saves);
  cluster   the ARCA line with nodes D and E on a three-master Redis Cluster (redis-server
            from the system, tests/redis_servers.py) instead of ARCA; skipped, saying so,
            without redis-server.

TTFT is the time to the first content chunk of the stream, total the time to `[DONE]`.
Prints median TTFT and total per line and their ratios to the baseline; target >= 10x for
both on the ARCA, balancer and cluster lines. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import parse_with_model  # noqa: E402
from bench.prefix_cache import document  # noqa: E402
from tests.e2e.fleet_processes import AUTH, FleetProcesses  # noqa: E402
from tests.e2e.test_fleet import wait_for  # noqa: E402

TARGET = 10.0


def streamed(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, float, str, dict[str, str]]:
    """(TTFT s, total s, text, lower-case headers) of one greedy streamed chat completion."""
    parts = urlsplit(url)
    body = orjson.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=600)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body=body,
                       headers={"Content-Type": "application/json", **AUTH})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{url}: {response.status} {response.read()[:500]!r}")
    headers = {key.lower(): value for key, value in response.getheaders()}
    ttft: float | None = None
    text = []
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        for choice in orjson.loads(line[6:]).get("choices", []):
            content = choice.get("delta", {}).get("content")
            if content:
                ttft = time.perf_counter() - started if ttft is None else ttft
                text.append(content)
    total = time.perf_counter() - started
    connection.close()
    return (total if ttft is None else ttft), total, "".join(text), headers


def pushed(fleet: FleetProcesses, url: str) -> float:
    return fleet.metric(url, "reame_prefix_cache_fleet_pushes_total")


def round_document(number: int, lines: int = 0) -> str:
    """A fresh document per round: bench/prefix_cache.py's diary (~2,000 tokens), or its first
    `lines` lines (about 18 tokens each), behind a line naming the round."""
    text = document()
    if lines:
        text = "\n".join(text.splitlines()[:lines]) + "\n\n"
    return f"Copy {number} of the regional office's records.\n" + text


def ask(doc: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": doc}, {"role": "user", "content": question}]


def run(args: argparse.Namespace) -> None:
    rows: dict[str, list[tuple[float, float]]] = {"baseline": [], "ARCA": [], "balancer": [], "L3": []}
    notes: list[str] = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="reame-bench-fleet-") as scratch, \
            FleetProcesses(Path(scratch), args.model, ctx=4096, parallel=2, threads=args.threads) as fleet:
        fleet.start_arca()
        for name in ("a", "b"):
            fleet.start_node(name, wait=False)
        fleet.start_node("c", arca=False, wait=False)
        for name in fleet.nodes:
            fleet.wait_node(name)
        fleet.start_balancer()
        try:
            l3_hits = measure(fleet, args, rows, notes, loads)
        except Exception:
            print(fleet.log_tails(), file=sys.stderr)
            raise
    report(rows, notes, loads, l3_hits, args)


def measure(fleet: FleetProcesses, args: argparse.Namespace, rows: dict[str, list[tuple[float, float]]],
            notes: list[str], loads: list[float]) -> float:
    """Every line's rounds into `rows`; returns node B's L3 restores."""
    node_a, node_b, cold = fleet.nodes["a"], fleet.nodes["b"], fleet.nodes["c"]
    for url in (node_a, node_b, cold):  # page the weights in, outside the timings
        streamed(url, [{"role": "user", "content": "Hello."}], 2)
    for number in range(args.rounds):
        doc = round_document(number, args.lines)
        question = f"Question {number + 1}: in week {number + 3}, what happened on Monday? Answer:"
        ttft, total, expected, _ = streamed(cold, ask(doc, question), args.max_tokens)
        rows["baseline"].append((ttft, total))
        answers, pushes = fleet.redis().dbsize(), pushed(fleet, node_a)
        streamed(node_a, ask(doc, question), args.max_tokens)
        # node A's L1 write and L3 push happen off the request path: wait for both
        fleet.wait_archived(answers + 1)
        wait_for(lambda: pushed(fleet, node_a) > pushes, 30, "node A's L3 push")
        ttft, total, text, headers = streamed(node_b, ask(doc, question), args.max_tokens)
        assert headers.get("x-reame-cache") == "hit", headers
        rows["ARCA"].append((ttft, total))
        if text != expected:
            notes.append(f"round {number}: node B's answer differs from the cold node's (near-ties)")

        other = ask(round_document(100 + number, args.lines), question)
        first = archived_answer(fleet, other, args.max_tokens, notes)
        ttft, total, _, second = streamed(fleet.balancer, other, args.max_tokens)
        assert second.get("x-reame-cache") == "hit", second
        rows["balancer"].append((ttft, total))
        notes.append(f"round {number}: balancer asks answered by {first.get('x-reame-node')} then "
                     f"{second.get('x-reame-node')}")

        fresh = f"Question {number + 50}: in week {number + 9}, what happened on Friday? Answer:"
        ttft, total, _, _ = streamed(node_b, ask(doc, fresh), args.max_tokens)
        rows["L3"].append((ttft, total))
        loads.append(os.getloadavg()[0])
    l3_hits = fleet.metric(node_b, "reame_prefix_cache_hits_total", tier="fleet")
    if shutil.which("redis-server") and shutil.which("redis-cli"):
        rows["cluster"] = through_cluster(fleet, fleet.base / "cluster", args, loads)
    else:
        notes.append("Redis Cluster line skipped: redis-server / redis-cli not installed")
    return l3_hits


def archived_answer(fleet: FleetProcesses, messages: list[dict[str, str]], max_tokens: int,
                    notes: list[str]) -> dict[str, str]:
    """Ask through the balancer until the answer is in ARCA (a lost L1 write is noted, with
    the nodes' failed archive writes, and the question asked again); the answering headers."""
    for attempt in range(3):
        answers = fleet.redis().dbsize()
        _, _, _, headers = streamed(fleet.balancer, messages, max_tokens)
        try:
            fleet.wait_archived(answers + 1)
            return headers
        except AssertionError:
            failed = {name: fleet.metric(url, "reame_archive_errors_total", operation="set")
                      for name, url in fleet.nodes.items() if name in ("a", "b")}
            notes.append(f"the answer of {headers.get('x-reame-node')} never reached ARCA (attempt {attempt + 1}; "
                         f"failed L1 writes per node: {failed}); asked again")
    raise AssertionError("no answer through the balancer reached ARCA in three attempts")


def through_cluster(fleet: FleetProcesses, directory: Path, args: argparse.Namespace,
                    loads: list[float]) -> list[tuple[float, float]]:
    """The ARCA line again with nodes D and E on a three-master Redis Cluster instead of ARCA."""
    from tests.redis_servers import RedisCluster

    cluster = RedisCluster(directory).start()
    try:
        node_d = fleet.start_node("d", remote=cluster.url(), wait=False)
        node_e = fleet.start_node("e", remote=cluster.url(), wait=False)
        fleet.wait_node("d")
        fleet.wait_node("e")
        for url in (node_d, node_e):
            streamed(url, [{"role": "user", "content": "Hello."}], 2)
        rows = []
        for number in range(args.rounds):
            doc = round_document(300 + number, args.lines)
            question = f"Question {number + 1}: in week {number + 3}, what happened on Monday? Answer:"
            keys = cluster_keys(cluster)
            streamed(node_d, ask(doc, question), args.max_tokens)
            wait_for(lambda: cluster_keys(cluster) > keys, 30, "node D's answer in the cluster")
            ttft, total, _, headers = streamed(node_e, ask(doc, question), args.max_tokens)
            assert headers.get("x-reame-cache") == "hit", headers
            rows.append((ttft, total))
            loads.append(os.getloadavg()[0])
        return rows
    finally:
        cluster.stop()


def cluster_keys(cluster) -> int:
    return sum(int(node.call("dbsize") or 0) for node in cluster.masters)


def report(rows: dict[str, list[tuple[float, float]]], notes: list[str], loads: list[float], l3_hits: float,
           args: argparse.Namespace) -> None:
    base_ttft = statistics.median(t for t, _ in rows["baseline"])
    base_total = statistics.median(t for _, t in rows["baseline"])
    print(f"fleet: {args.rounds} rounds, {args.lines or 'all'}-line documents, {args.max_tokens} tokens, "
          f"{args.threads} threads per node")
    print(f"{'':<36}{'TTFT ms':>10}{'total ms':>10}{'TTFT x':>9}{'total x':>9}")
    labels = {"baseline": "baseline: cold node C", "ARCA": "node B after node A, via ARCA",
              "balancer": "second ask through HAProxy", "L3": "node B, new question (L3)",
              "cluster": "node E after node D, Redis Cluster"}
    verdicts = []
    for name, label in labels.items():
        if name not in rows:
            continue
        ttft = statistics.median(t for t, _ in rows[name])
        total = statistics.median(t for _, t in rows[name])
        print(f"{label:<36}{ttft * 1000:>10.1f}{total * 1000:>10.1f}{base_ttft / ttft:>8.1f}x{base_total / total:>8.1f}x")
        if name in ("ARCA", "balancer", "cluster"):
            ok = base_ttft / ttft >= TARGET and base_total / total >= TARGET
            verdicts.append(f"{name}: {'met' if ok else 'MISSED'}")
    print(f"node B's L3 (fleet) restores: {l3_hits:.0f} of {args.rounds} new questions")
    for note in notes:
        print(f"  {note}")
    print(f"target >= {TARGET:.0f}x TTFT and total: {', '.join(verdicts)}")
    print(f"load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=56, help="document lines (0 = all ~110, ~2,000 tokens)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parse_with_model(parser)
    print_header(args.model)
    run(args)


if __name__ == "__main__":
    main()
