"""A classification batch through `reame batch` against the same lines sent one by one.

    .venv/bin/python bench/batch.py [--lines 200] [--model PATH] [--probes 8]

200 chat requests share one instruction (a sentiment label for a product review; 160
distinct reviews, 40 repeated, as tagging jobs have them), greedy, 8 tokens. Each side gets
a fresh node (`reame run MODEL --serve`, prefix cache and speculation on, 4 slots, empty
archive):
- batch: `reame batch lines.jsonl --server URL` (the node's Batch API), wall time of the
  command;
- one by one: a plain client POSTing each line and waiting for its answer, wall time.
Both nodes' `/v1/reame/stats` figures follow (tokens served, computed, saved per tier). Then
fairness on the batch node: the p50 latency of `--probes` live chat requests alone, and again
while a second batch of new lines runs (then cancelled with Ctrl-C), and their ratio
(`--fairness-only`: that part alone, on one fresh node). Prints the load average (`uptime`)
before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from host import print_header  # noqa: E402

from node_process import default_model, node_server  # noqa: E402

INSTRUCTION = ("You label product reviews for an online shop. Read the review and answer with exactly one word: "
               "positive, negative or mixed. Positive means the customer is satisfied with the product; negative "
               "means the customer is not satisfied or wants a refund; mixed means the review praises some parts "
               "and criticises others. Do not explain your answer.\n\nReview: ")
OPENINGS = ("I bought this {p} last month and", "The {p} arrived two days late and", "My sister gave me this {p};",
            "After a week with the {p},", "For the price, this {p}", "Honestly, the {p}",
            "We ordered the {p} for the office and", "The {p} looks great but")
VERDICTS = ("it works perfectly.", "it broke on the second day.", "the battery lasts forever.",
            "I want my money back.", "the colour faded after one wash.", "I would buy it again.",
            "the instructions were useless.", "it is exactly as described.", "the smell is awful.",
            "customer service was very helpful.")
NO_OVERLAP = " (the batch ended before the probes: rerun with more --lines)"
PRODUCTS = ("kettle", "desk lamp", "backpack", "blender", "phone case", "rain jacket", "toaster", "headset")


def reviews(count: int, repeats: int, offset: int = 0) -> list[str]:
    distinct = [f"{OPENINGS[i % len(OPENINGS)].format(p=PRODUCTS[(i // len(OPENINGS)) % len(PRODUCTS)])} "
                f"{VERDICTS[(i * 7 + i // 80) % len(VERDICTS)]}" for i in range(offset, offset + count - repeats)]
    return distinct + [distinct[(i * 13) % len(distinct)] for i in range(repeats)]


def lines(texts: list[str], prefix: str) -> list[dict]:
    return [{"custom_id": f"{prefix}-{i:04d}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": INSTRUCTION + text + "\nLabel:"}],
                      "max_tokens": 8, "temperature": 0}} for i, text in enumerate(texts)]


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return orjson.loads(response.read())


def stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/v1/reame/stats", timeout=60) as response:
        return orjson.loads(response.read())["since_start"]


def describe(figures: dict) -> str:
    saved = figures["saved"]
    return (f"served {figures['tokens_served']} tokens, computed {figures['tokens_computed']}; saved: "
            f"L1 {saved['l1']['answers']} answers / {saved['l1']['tokens']} tokens ({saved['l1']['share']:.0%}), "
            f"prefix {saved['prefix']['tokens']} ({saved['prefix']['share']:.0%}), "
            f"drafts {saved['drafts']['tokens']} ({saved['drafts']['share']:.0%}) {saved['drafts']['by_source']}; "
            f"effective {figures['effective_tokens_per_second']} tok/s, plain {figures['plain_tokens_per_second']} "
            f"tok/s, speed-up {figures['speedup']}")


def wait_calibrated(url: str, timeout: float = 300) -> None:
    """Speculation calibrates at start and gives way to requests: let it finish first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/v1/reame/stats", timeout=30) as response:
            if orjson.loads(response.read())["since_start"]["plain_tokens_per_second"]:
                return
        time.sleep(0.5)


def probe(url: str, count: int, tag: str) -> list[float]:
    """Latencies of `count` live chat requests, one after the other (new prompts: no L1)."""
    seconds = []
    for i in range(count):
        body = {"messages": [{"role": "user", "content": f"Give a short name for a {tag} cat number {i}."}],
                "max_tokens": 8, "temperature": 0}
        start = time.perf_counter()
        post(url, "/v1/chat/completions", body)
        seconds.append(time.perf_counter() - start)
    return seconds


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--fairness-only", action="store_true", help="skip the comparison: live p50 alone and "
                        "during a batch, on one fresh node")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    model = str(args.model or default_model())
    env = {"REAME_CACHE_ENABLED": "true"}
    work = Path(tempfile.mkdtemp(prefix="reame-bench-batch-"))
    batch_lines = lines(reviews(args.lines, args.lines // 5), "line")
    source = work / "lines.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in batch_lines))
    print(f"{len(batch_lines)} lines, one instruction; {uptime()}", flush=True)

    if args.fairness_only:
        with node_server(model, env=env) as (url, _, _):
            wait_calibrated(url)
            fairness(url, args, work)
        return 0

    with node_server(model, env=env) as (url, _, _):
        wait_calibrated(url)
        start = time.perf_counter()
        for line in batch_lines:
            post(url, line["url"], line["body"])
        serial_s = time.perf_counter() - start
        serial_stats = stats(url)
    print(f"one by one: {serial_s:.1f} s ({len(batch_lines) / serial_s:.2f} lines/s); {describe(serial_stats)}",
          flush=True)

    with node_server(model, env=env) as (url, _, _):
        wait_calibrated(url)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "node.cli", "batch", str(source), "-o", str(work / "out.jsonl"),
                               "--server", url], cwd=ROOT, capture_output=True, text=True)
        batch_s = time.perf_counter() - start
        if done.returncode != 0:
            print(done.stdout, done.stderr[-2000:])
            return 1
        batch_stats = stats(url)
        print(f"reame batch: {batch_s:.1f} s ({len(batch_lines) / batch_s:.2f} lines/s); {describe(batch_stats)}")
        print(f"  {done.stdout.strip()}")
        print(f"ratio: reame batch {serial_s / batch_s:.2f}x faster than one by one; {uptime()}", flush=True)
        fairness(url, args, work)
    return 0


def fairness(url: str, args: argparse.Namespace, work: Path) -> None:
    """Live chat p50 alone, then while a batch of new lines runs (cancelled afterwards)."""
    alone = probe(url, args.probes, "quiet")
    second = work / "second.jsonl"
    second.write_bytes(b"".join(orjson.dumps(line) + b"\n"
                                for line in lines(reviews(args.lines, 0, offset=10_000), "second")))
    background = subprocess.Popen([sys.executable, "-m", "node.cli", "batch", str(second), "-o",
                                   str(work / "second.out.jsonl"), "--server", url], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)  # the batch is running
    during = probe(url, args.probes, "busy")
    overlapped = background.poll() is None
    background.send_signal(signal.SIGINT)  # Ctrl-C: the node's batch is cancelled
    background.wait(600)
    p50_alone, p50_during = statistics.median(alone), statistics.median(during)
    print(f"fairness: live chat p50 {p50_alone * 1000:.0f} ms alone, {p50_during * 1000:.0f} ms during a batch "
          f"({p50_during / p50_alone:.2f}x){'' if overlapped else NO_OVERLAP}; {uptime()}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
