"""L3 across the fleet: a ~2,500-token prefix on node B, prefilled cold against restored from
what node A stored in ARCA, in the same run.

    .venv/bin/python bench/l3_fleet.py [--rounds 2] [--lines 105] [--threads 2] [--model PATH]

Processes (tests/e2e/fleet_processes.py): a real `reame arca` and nodes on it (f16 KV, prefix
cache on, 4,096-token context, one sequence). Each round has two fresh documents of `--lines`
lines (~24 tokens each) and a question:

  L3    a new node A warms document 1 (`POST /v1/warm`) and is stopped with SIGTERM at once:
        its graceful stop flushes the states to ARCA. Node B then asks a question on
        document 1: the document's state comes from ARCA (fetch, verify, restore), the
        question is prefilled, one token is decoded;
  cold  node B asks the same question on document 2, which nobody has seen: the whole prompt
        is prefilled, one token decoded.

Prints both times per round (the whole request, which is the time to the first token), their
ratio (target >= 25x), and node B's stage times from /metrics: the fetch of the parts, their
verification and assembly, the local lookup, and what is left (the restore into llama.cpp's
KV, the question's prefill, the token, HTTP). The host header comes first (bench/host.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import parse_with_model  # noqa: E402
from tests.e2e.fleet_processes import AUTH, FleetProcesses  # noqa: E402
from tests.node.api.live import http_json  # noqa: E402

TARGET = 25.0
SUBJECTS = ("The northern depot", "The river crossing", "The eastern mill", "The harbour office",
            "The hill farm", "The old quarry", "The rail yard")


def document(number: int, lines: int) -> str:
    body = "\n".join(f"Week {i // 6 + 1}, day {i % 6 + 1}: {SUBJECTS[(i + number) % 7]} moved "
                     f"{(i * 7 + number * 13) % 97 + 3} crates of item {i}." for i in range(lines))
    return f"Operations diary number {number} of the regional office.\n{body}\n\n"


def ask(fleet: FleetProcesses, url: str, doc: str, question: str) -> tuple[float, dict]:
    """(seconds, usage) of a one-token greedy chat: its time is the time to the first token."""
    started = time.perf_counter()
    _, body = fleet.chat(url, [{"role": "system", "content": doc}, {"role": "user", "content": question}],
                         max_tokens=1)
    return time.perf_counter() - started, body["usage"]


STAGES = {"fetch": ("reame_prefix_cache_fleet_seconds_total", {"stage": "fetch"}),
          "verify": ("reame_prefix_cache_fleet_seconds_total", {"stage": "verify"}),
          "lookup": ("reame_prefix_cache_restore_seconds_total", {}),
          "bytes": ("reame_prefix_cache_fetched_bytes_total", {}),
          "hits": ("reame_prefix_cache_hits_total", {"tier": "fleet"})}


def stages(fleet: FleetProcesses, url: str) -> dict[str, float]:
    return {name: fleet.metric(url, series, **labels) for name, (series, labels) in STAGES.items()}


def run(args: argparse.Namespace) -> None:
    rows = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="reame-bench-l3-") as scratch, \
            FleetProcesses(Path(scratch), args.model, ctx=4096, parallel=1, threads=args.threads) as fleet:
        fleet.start_arca()
        node_b = fleet.start_node("b")
        ask(fleet, node_b, "Hello.", "Hi.")  # page the weights in, outside the timings
        for number in range(args.rounds):
            question = f"Question {number + 1}: in week {number + 3}, which subject moved the most crates? Answer:"
            shared, fresh = document(2 * number + 1, args.lines), document(2 * number + 2, args.lines)
            name = f"a{number}"
            node_a = fleet.start_node(name)
            status, _, warmed = http_json("POST", f"{node_a}/v1/warm",
                                          {"messages": [{"role": "system", "content": shared}]},
                                          headers=AUTH, timeout=900)
            assert status == 200 and warmed["stored_tokens"] > 0, warmed
            process = fleet.node_processes[name]
            process.send_signal(signal.SIGTERM)
            stopped = time.perf_counter()
            assert process.wait(120) == 0
            stop_s = time.perf_counter() - stopped
            flush_line = next((line for line in (fleet.base / f"node-{name}.log").read_text().splitlines()
                               if "node.serving.flush" in line and "flushing" not in line), "(no flush line)")
            before = stages(fleet, node_b)
            l3_s, l3_usage = ask(fleet, node_b, shared, question)
            after = stages(fleet, node_b)
            cold_s, cold_usage = ask(fleet, node_b, fresh, question)
            loads.append(os.getloadavg()[0])
            delta = {k: after[k] - before[k] for k in after}
            rows.append((l3_s, cold_s, l3_usage, cold_usage, delta, stop_s, flush_line.split("] ", 1)[-1]))
    report(rows, loads)


def report(rows: list, loads: list[float]) -> None:
    print(f"{'round':>5} {'prompt':>7} {'restored':>9} {'cold prompt':>12} {'cold ms':>9} {'L3 ms':>8} {'ratio':>7}"
          f" {'fetch':>7} {'verify':>7} {'lookup':>7} {'rest':>7} {'MB':>6}  (stages in ms)")
    for i, (l3_s, cold_s, l3_usage, cold_usage, delta, _, _) in enumerate(rows):
        restored = (l3_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        known = delta["fetch"] + delta["verify"] + delta["lookup"]
        print(f"{i + 1:>5} {l3_usage['prompt_tokens']:>7} {restored:>9} {cold_usage['prompt_tokens']:>12} {cold_s * 1000:>9.0f} {l3_s * 1000:>8.0f} "
              f"{cold_s / l3_s:>6.1f}x {delta['fetch'] * 1000:>7.1f} {delta['verify'] * 1000:>7.1f} "
              f"{delta['lookup'] * 1000:>7.1f} {(l3_s - known) * 1000:>7.1f} {delta['bytes'] / 1e6:>6.1f}"
              f"{'' if delta['hits'] == 1 else '  (no L3 hit!)'}")
    for i, (*_, stop_s, flush_line) in enumerate(rows):
        print(f"  round {i + 1}: node A stopped {stop_s:.2f} s after SIGTERM; its log: {flush_line}")
    ratio = statistics.median(cold_s / l3_s for l3_s, cold_s, *_ in rows)
    print(f"median ratio cold / L3: {ratio:.1f}x (target >= {TARGET:.0f}x: {'met' if ratio >= TARGET else 'MISSED'})")
    print(f"load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=105, help="document lines, ~24 tokens each (105: ~2,500)")
    parser.add_argument("--threads", type=int, default=2)
    args = parse_with_model(parser)
    print_header(args.model, threads=args.threads)
    run(args)


if __name__ == "__main__":
    main()
