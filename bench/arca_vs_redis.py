"""ARCA against redis-server with redis-benchmark: ops/s and the ARCA/redis ratio per test.

    .venv/bin/python bench/arca_vs_redis.py [--requests-p1 N] [--requests-p16 N] [--rounds R]
        [--tests set,get,...] [--modes commit,everysec] [--no-rss]
    .venv/bin/python bench/arca_vs_redis.py --rss-only [--keys N]

Three configurations (`--modes`), each server on a free port of 127.0.0.1:
  commit        ARCA durability=commit (every acked write committed, group commit per
                event-loop tick)  vs  redis-server without persistence;
  everysec      ARCA durability=everysec  vs  redis-server without persistence (what the
                targets are stated against);
  everysec-aof  ARCA durability=everysec  vs  redis-server appendonly yes + everysec (like
                for like).
The targets (ratios against redis-server without persistence) are checked at the end.
For every test (ping, set, get, incr, mset) at -P 1 and -P 16, runs alternate between the two
servers `--rounds` times and the best run of each is reported (the machine is shared, so the
best run is the least disturbed one). Then ARCA's RSS holding 1M keys (redis-server's for
comparison) and, when the corpus commands exist, ARCA.DRAFT latency over loopback with a
1M-token corpus. The machine's load average is printed with every table: on a shared
machine, compare ratios measured under similar load.

`--rss-only` runs just the RSS measurement: both servers (ARCA durability=commit, redis
without persistence) get the same `--keys` keys (`key:%09d` -> `value:%09d`, piped through
`redis-cli --pipe`), and the bench prints each one's VmRSS before and after the fill, the
bytes per key and the ARCA/redis ratio of the filled RSS against the 1.3x target, then
ARCA's RSS after a restart on the same directory (the keys read back from its log).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arca.launch import free_port, spawn_arca, stop, wait_for_pong  # noqa: E402  (after the checkout is on the path)
from bench.host import host_line  # noqa: E402

TESTS = ("ping", "set", "get", "incr", "mset")
SHARE = {"mset": 0.2}  # MSET writes 10 keys per request: fewer requests keep the run short


def start_arca(directory: Path, durability: str, max_mb: int = 2048) -> tuple[subprocess.Popen, int]:
    return spawn_arca(directory, "--durability", durability, "--max-mb", str(max_mb), "--log-level", "warning")


def start_redis(directory: Path, appendonly: bool) -> tuple[subprocess.Popen, int]:
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--dir", str(directory), "--daemonize", "no", "--loglevel", "warning"]
    args += ["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    wait_for_pong(port, proc)
    return proc, port


def benchmark(port: int, test: str, pipeline: int, requests: int) -> dict[str, float]:
    """ops/s per redis-benchmark test name (ping gives PING_INLINE and PING_MBULK)."""
    done = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(requests), "-P", str(pipeline),
         "-r", "100000", "-t", test, "--csv"],
        capture_output=True, text=True, timeout=600,
    )
    rows = list(csv.reader(io.StringIO(done.stdout)))
    return {row[0]: float(row[1]) for row in rows[1:] if len(row) > 1}


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fill(port: int, count: int) -> None:
    payload = b"".join(
        b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)
        for k, v in ((b"key:%09d" % i, b"value:%09d" % i) for i in range(count))
    )
    subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=payload, capture_output=True, check=True, timeout=900)


RSS_TARGET = 1.3  # ARCA's RSS with the keys over redis-server's, at most


def measure_rss(base: Path, keys: int, then=None) -> tuple[list[str], int, int]:
    """Fill ARCA and redis-server with the same keys; the report lines and both filled RSS.
    `then(arca_port)`, when given, runs against the filled ARCA and its line is reported
    too; both servers are stopped afterwards."""
    (base / "rss-a").mkdir()
    (base / "rss-r").mkdir()
    arca, arca_port = start_arca(base / "rss-a", "commit")
    redis, redis_port = start_redis(base / "rss-r", False)
    try:
        empty = {"ARCA": rss_bytes(arca.pid), "redis": rss_bytes(redis.pid)}
        fill(arca_port, keys)
        fill(redis_port, keys)
        time.sleep(1.0)  # a commit tick and idle maintenance settle
        full = {"ARCA": rss_bytes(arca.pid), "redis": rss_bytes(redis.pid)}
        after = [then(arca_port)] if then is not None else []
        stop(arca)
        began = time.perf_counter()
        arca, arca_port = start_arca(base / "rss-a", "commit")  # the same keys, read back from disk
        reopened, reopen_s = rss_bytes(arca.pid), time.perf_counter() - began
    finally:
        stop(arca)
        stop(redis)
    lines = [f"RSS with {keys:,} keys ({load_average()}):"]
    for name in ("ARCA", "redis"):
        lines.append(f"  {name:<5} {full[name] / 2**20:7,.1f} MiB (empty {empty[name] / 2**20:5.1f} MiB, "
                     f"{(full[name] - empty[name]) / keys:5.1f} bytes per key)")
    ratio = full["ARCA"] / full["redis"]
    lines.append(f"  ratio {ratio:.2f}x (target <= {RSS_TARGET:.1f}x): {'met' if ratio <= RSS_TARGET else 'NOT met'}")
    lines.append(f"  ARCA after a restart on the same keys: {reopened / 2**20:,.1f} MiB "
                 f"({reopened / full['redis']:.2f}x redis; reopened in {reopen_s:.1f} s)")
    return lines + after, full["ARCA"], full["redis"]


def draft_latency(port: int) -> str:
    import random

    import redis

    client = redis.Redis(port=port, protocol=2)
    try:
        client.execute_command("ARCA.DRAFT", struct.pack("<3I", 1, 2, 3), 4)
    except redis.ResponseError as exc:
        if "unknown command" in str(exc):
            return "ARCA.DRAFT: not available in this build"
        raise
    rng = random.Random(7)
    phrases = [[rng.randrange(32000) for _ in range(40)] for _ in range(500)]
    observed = 0
    pipe = client.pipeline(transaction=False)
    streams = []
    while observed < 1_000_000:
        stream = []
        while len(stream) < 1000:
            stream += rng.choice(phrases)[: rng.randrange(8, 40)]
        streams.append(stream)
        pipe.execute_command("ARCA.OBSERVE", struct.pack(f"<{len(stream)}I", *stream))
        observed += len(stream)
        if len(streams) % 50 == 0:
            pipe.execute()
    pipe.execute()
    samples = []
    hits = 0
    for _ in range(3000):
        stream = rng.choice(streams)
        start = rng.randrange(0, len(stream) - 16)
        tail = struct.pack("<8I", *stream[start : start + 8])
        began = time.perf_counter()
        reply = client.execute_command("ARCA.DRAFT", tail, 8)
        samples.append(time.perf_counter() - began)
        hits += reply is not None
    samples.sort()
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    client.close()
    return (f"ARCA.DRAFT over loopback, {observed:,} tokens observed: p50 {p50 * 1e3:.3f} ms, "
            f"p99 {p99 * 1e3:.3f} ms, hits {hits}/{len(samples)}")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


# (mode, test, -P) -> the lowest acceptable ARCA/redis ratio (redis without persistence)
TARGETS = {
    ("commit", "GET", 1): 0.8, ("commit", "GET", 16): 0.4,
    ("commit", "SET", 1): 0.5, ("commit", "SET", 16): 0.15,
    ("everysec", "SET", 1): 0.8, ("everysec", "SET", 16): 0.8,
}
CONFIGURATIONS = {  # mode -> (title, ARCA durability, redis appendonly)
    "commit": ("ARCA durability=commit vs redis without persistence", "commit", False),
    "everysec": ("ARCA durability=everysec vs redis without persistence", "everysec", False),
    "everysec-aof": ("ARCA durability=everysec vs redis appendonly yes + everysec", "everysec", True),
}


def run_table(title: str, arca: int, redis: int, args: argparse.Namespace) -> tuple[list[str], dict]:
    """The table of one configuration, and {(test, -P): ratio}."""
    ratios: dict[tuple[str, int], float] = {}
    lines = [f"{title}; {load_average()} at start",
             f"{'test':<12} {'-P':>3} {'ARCA ops/s':>12} {'redis ops/s':>12} {'ratio':>7}"]
    print(lines[0], lines[1], sep="\n", flush=True)
    for pipeline, requests in ((1, args.requests_p1), (16, args.requests_p16)):
        for test in args.tests:
            best: dict[str, dict[str, float]] = {"arca": {}, "redis": {}}
            for _ in range(args.rounds):
                for name, port in (("arca", arca), ("redis", redis)):
                    count = int(requests * SHARE.get(test, 1.0))
                    for key, value in benchmark(port, test, pipeline, count).items():
                        best[name][key] = max(best[name].get(key, 0.0), value)
            for key in sorted(best["arca"]):
                a, r = best["arca"][key], best["redis"].get(key, 0.0)
                ratio = a / r if r else float("nan")
                ratios[(key, pipeline)] = ratio
                lines.append(f"{key:<12} {pipeline:>3} {a:>12,.0f} {r:>12,.0f} {ratio:>6.2f}x")
                print(lines[-1], flush=True)
    lines.append(load_average() + " at end")
    print(lines[-1], flush=True)
    return lines, ratios


def check_targets(measured: dict[tuple[str, str, int], float]) -> list[str]:
    lines = ["targets (ARCA/redis without persistence):"]
    for (mode, test, pipeline), target in TARGETS.items():
        ratio = measured.get((mode, test, pipeline))
        if ratio is not None:
            verdict = "met" if ratio >= target else "NOT met"
            lines.append(f"  {mode:<9} {test} -P {pipeline:<2} {ratio:.2f}x (target {target:.2f}x): {verdict}")
    return lines if len(lines) > 1 else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-p1", type=int, default=60_000)
    parser.add_argument("--requests-p16", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys for the RSS measurement")
    parser.add_argument("--tests", type=lambda text: text.split(","), default=list(TESTS),
                        help=f"comma-separated subset of {','.join(TESTS)}")
    parser.add_argument("--modes", type=lambda text: text.split(","), default=list(CONFIGURATIONS),
                        help=f"configurations to run: {','.join(CONFIGURATIONS)}")
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS and ARCA.DRAFT measurements")
    parser.add_argument("--rss-only", action="store_true",
                        help="only ARCA's and redis-server's RSS with --keys keys, and their ratio")
    args = parser.parse_args()
    print(host_line(), flush=True)
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if shutil.which(tool) is None:
            print(f"{tool} not found: apt-get install redis-server redis-tools", file=sys.stderr)
            return 2
    unknown = set(args.modes) - set(CONFIGURATIONS)
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(sorted(unknown))}; choose from {', '.join(CONFIGURATIONS)}")
    report: list[str] = []
    measured: dict[tuple[str, str, int], float] = {}
    if args.rss_only:
        with tempfile.TemporaryDirectory(prefix="arca-bench-") as tmp:
            lines, _, _ = measure_rss(Path(tmp), args.keys)
        print("\n".join(lines))
        return 0
    with tempfile.TemporaryDirectory(prefix="arca-bench-") as tmp:
        base = Path(tmp)
        for mode in args.modes:
            title, durability, appendonly = CONFIGURATIONS[mode]
            (base / f"a-{mode}").mkdir()
            (base / f"r-{mode}").mkdir()
            arca, arca_port = start_arca(base / f"a-{mode}", durability)
            redis, redis_port = start_redis(base / f"r-{mode}", appendonly)
            try:
                lines, ratios = run_table(title, arca_port, redis_port, args)
                report += lines + [""]
                measured.update({(mode, test, pipeline): ratio for (test, pipeline), ratio in ratios.items()})
            finally:
                stop(arca)
                stop(redis)
        report += check_targets(measured)
        if args.no_rss:
            print("\n" + "\n".join(report))
            return 0
        lines, _, _ = measure_rss(base, args.keys, then=draft_latency)
        report += lines
        print("\n".join(lines), flush=True)
    print("\n" + "\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
