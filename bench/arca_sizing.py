"""ARCA sizing: RAM and disk per 1,000 answers (L1 with their L4 observations) and per L3 prefix.

    .venv/bin/python bench/arca_sizing.py [--answers 6] [--answer-tokens 32] [--replay 1000] [--documents 2] [--lines 28] [--model PATH]

A real `reame arca` process and one node pointed at it (tests/e2e/fleet_processes.py):
  1. the node answers `--answers` distinct greedy chat questions (`--answer-tokens` each): real L1
     entries and real L4 observations in ARCA;
  2. those entries are read back (SCAN, GET; ARCA.SINCE) and written again `--replay` times
     under new keys of the same length (SET, ARCA.OBSERVE), so the 1,000 answers have the
     sizes real ones have;
  3. the node warms `--documents` documents (bench/fleet.py's, `--lines` lines: ~500 tokens
     by default) with POST /v1/warm: one L3 prefix each, pushed to ARCA.
After each step ARCA's resident memory (VmRSS of the process) and its directory on disk
(archive.db with its WAL, after a checkpoint) are read; the deltas are printed per 1,000
answers and per prefix (and per 1,000 prefix tokens). No target: these size a deployment.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import round_document  # noqa: E402
from bench.host import print_header  # noqa: E402
from bench.offline_model import parse_with_model  # noqa: E402
from tests.e2e.fleet_processes import AUTH, FleetProcesses  # noqa: E402
from tests.e2e.test_fleet import wait_for  # noqa: E402
from tests.node.api.live import http_json  # noqa: E402

MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


class Meter:
    def __init__(self, fleet: FleetProcesses, directory: Path) -> None:
        self.fleet, self.directory = fleet, directory

    def read(self) -> tuple[int, int]:
        client = self.fleet.redis()
        client.execute_command("SAVE")  # a checkpoint: the WAL folded into archive.db
        time.sleep(0.5)
        assert self.fleet.arca_process is not None
        return rss_bytes(self.fleet.arca_process.pid), disk_bytes(self.directory)


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="reame-bench-sizing-") as scratch, \
            FleetProcesses(Path(scratch), args.model, ctx=4096, parallel=2, threads=2) as fleet:
        directory = Path(scratch) / "arca"
        fleet.start_arca(directory)
        node = fleet.start_node("a")
        meter = Meter(fleet, directory)
        client = fleet.redis()
        empty = meter.read()

        for i in range(args.answers):
            fleet.chat(node, [{"role": "user", "content": f"Write note {i} about the {i}th crate of apples."}],
                       max_tokens=args.answer_tokens)
        fleet.wait_archived(args.answers)
        keys = sorted(client.scan_iter(count=1000))
        values = [client.get(key) or b"" for key in keys]
        fingerprint = http_json("GET", f"{node}/v1/models", headers=AUTH)[2]["data"][0]["fingerprint"]
        streams = [payload for _, payload in client.execute_command("ARCA.SINCE", "NS", fingerprint, 0,
                                                                    "COUNT", 10_000)]
        real = meter.read()

        pipe = client.pipeline(transaction=False)
        for i in range(args.replay):
            key = keys[i % len(keys)]
            suffix = f"{i:08d}".encode()
            pipe.set(key[: len(key) - len(suffix)] + suffix, values[i % len(values)])
            if streams:
                pipe.execute_command("ARCA.OBSERVE", "NS", fingerprint, streams[i % len(streams)])
            if i % 200 == 199:
                pipe.execute()
        pipe.execute()
        replayed = meter.read()

        pushes = fleet.metric(node, "reame_prefix_cache_fleet_pushes_total")
        prefix_tokens = []
        for number in range(args.documents):
            status, _, warmed = http_json("POST", f"{node}/v1/warm", timeout=900, body={
                "messages": [{"role": "system", "content": round_document(200 + number, args.lines)}]}, headers=AUTH)
            assert status == 200, warmed
            prefix_tokens.append(warmed["stored_tokens"])
        wait_for(lambda: fleet.metric(node, "reame_prefix_cache_fleet_pushes_total") >= pushes + args.documents,
                 60, "the L3 pushes")
        warmed_state = meter.read()

    print(f"ARCA sizing: {args.answers} real answers (up to {args.answer_tokens} tokens), replayed {args.replay} times; "
          f"{args.documents} documents warmed")
    print(f"  L1 value bytes: median {statistics.median(len(v) for v in values):.0f} "
          f"(min {min(len(v) for v in values)}, max {max(len(v) for v in values)}); key bytes {len(keys[0])}")
    if streams:
        print(f"  L4 observation bytes: median {statistics.median(len(s) for s in streams):.0f} "
              f"({statistics.median(len(s) for s in streams) / 4:.0f} tokens)")
    print(f"  empty ARCA: RSS {empty[0] / MIB:.1f} MiB, disk {empty[1] / MIB:.2f} MiB")
    per_k = 1000 / args.replay
    print(f"  per 1,000 answers (L1 + L4): RSS +{(replayed[0] - real[0]) * per_k / MIB:.2f} MiB, "
          f"disk +{(replayed[1] - real[1]) * per_k / MIB:.2f} MiB")
    tokens = statistics.median(prefix_tokens)
    per_prefix_disk = (warmed_state[1] - replayed[1]) / args.documents
    per_prefix_rss = (warmed_state[0] - replayed[0]) / args.documents
    print(f"  per L3 prefix of {tokens:.0f} tokens: disk +{per_prefix_disk / MIB:.2f} MiB "
          f"({per_prefix_disk / tokens * 1000 / MIB:.2f} MiB per 1,000 tokens), RSS +{per_prefix_rss / MIB:.2f} MiB")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=6)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--replay", type=int, default=1000)
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--lines", type=int, default=28, help="document lines (0 = all ~110, ~2,000 tokens)")
    args = parse_with_model(parser)
    print_header(args.model)
    run(args)


if __name__ == "__main__":
    main()
