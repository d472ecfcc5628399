"""Load: 8 concurrent clients, 400 mixed requests, against the same mix from 1 client.

    .venv/bin/python bench/load.py [--clients 8] [--requests 400] [--baseline 60] [--model PATH]

One node process (4 slots, embedded archive). The mix, drawn with a fixed seed: greedy chat
(a third of them repeat an earlier question, so the archive answers), sampled chat,
streamed chat, greedy and sampled /v1/completions, n=2 choices; 4 to 32 new tokens each.
The baseline runs `--baseline` requests of a fresh mix one at a time; the load run sends
`--requests` from `--clients` concurrent clients. Any 5xx other than 503 (documented load
shedding, with Retry-After) is a failure. Prints p50/p99 latency, aggregate tokens/s
(completion tokens delivered, hits included, and tokens the model generated) and the
ratio of the load run's aggregate to the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host import print_header  # noqa: E402
from node_process import default_model, node_process, percentile  # noqa: E402

TOPICS = ["rivers", "colors", "fruits", "planets", "tools", "birds", "cities", "metals", "trees", "games",
          "stones", "clouds", "spices", "boats", "songs", "bridges"]


def mix(count: int, seed: int) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    asked: list[dict] = []
    requests = []
    for number in range(count):
        kind = rng.choice(["greedy", "greedy", "sampled", "stream", "text", "text-sampled", "n2"])
        tokens = rng.choice([4, 8, 16, 32])
        question = f"Name {rng.randint(2, 5)} {rng.choice(TOPICS)} ({seed}-{number})."
        chat = {"model": "gemma3-270m", "messages": [{"role": "user", "content": question}], "max_tokens": tokens}
        if kind == "greedy":
            body = rng.choice(asked) if asked and rng.random() < 1 / 3 else {**chat, "temperature": 0}
            asked.append(body)
            requests.append(("/v1/chat/completions", body))
        elif kind == "sampled":
            requests.append(("/v1/chat/completions", {**chat, "temperature": 0.8}))
        elif kind == "stream":
            requests.append(("/v1/chat/completions", {**chat, "temperature": 0.8, "stream": True,
                                                      "stream_options": {"include_usage": True}}))
        elif kind == "n2":
            requests.append(("/v1/chat/completions", {**chat, "temperature": 0.9, "n": 2}))
        else:
            requests.append(("/v1/completions", {"model": "gemma3-270m", "prompt": f"A list of {question}\n1.",
                                                 "max_tokens": tokens,
                                                 "temperature": 0 if kind == "text" else 0.8}))
    return requests


async def send(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> tuple[int, float, int, str]:
    started = time.perf_counter()
    async with session.post(url + path, json=body) as response:
        if body.get("stream"):
            usage = 0
            async for line in response.content:
                if line.startswith(b"data: {") and b'"usage":{' in line:
                    usage = int(line.split(b'"completion_tokens":')[1].split(b",")[0])
            tokens = usage
        else:
            payload = await response.json()
            tokens = payload.get("usage", {}).get("completion_tokens", 0) if response.status == 200 else 0
        return response.status, time.perf_counter() - started, tokens, response.headers.get("X-Reame-Cache", "")


async def run(url: str, requests: list[tuple[str, dict]], clients: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)
    results: list[tuple[int, float, int, str]] = []

    async def client() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            while not queue.empty():
                path, body = queue.get_nowait()
                results.append(await send(session, url, path, body))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    statuses = Counter(status for status, *_ in results)
    caches = Counter(cache for *_, cache in results)
    latencies = [elapsed for status, elapsed, _, _ in results if status == 200]
    delivered = sum(tokens for status, _, tokens, _ in results if status == 200)
    generated = sum(tokens for status, _, tokens, cache in results if status == 200 and cache != "hit")
    return {"wall": wall, "statuses": statuses, "caches": caches, "p50": statistics.median(latencies),
            "p99": percentile(latencies, 0.99), "delivered": delivered / wall, "generated": generated / wall,
            "bad": sum(count for status, count in statuses.items() if status >= 500 and status != 503)}


def report(name: str, result: dict) -> None:
    print(f"{name:<22} wall {result['wall']:7.1f} s  p50 {result['p50'] * 1000:8.0f} ms  p99 "
          f"{result['p99'] * 1000:8.0f} ms  delivered {result['delivered']:6.1f} tok/s  generated "
          f"{result['generated']:6.1f} tok/s  statuses {dict(result['statuses'])}  cache {dict(result['caches'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--baseline", type=int, default=60)
    parser.add_argument("--model", help="GGUF path (default: the offline gemma3-270m)")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    with node_process(args.model or default_model()) as url:
        baseline = asyncio.run(run(url, mix(args.baseline, seed=1), 1))
        report("baseline (1 client)", baseline)
        loaded = asyncio.run(run(url, mix(args.requests, seed=2), args.clients))
        report(f"load ({args.clients} clients)", loaded)
    print(f"aggregate generated tok/s: {loaded['generated'] / baseline['generated']:.2f}x the single client; "
          f"delivered: {loaded['delivered'] / baseline['delivered']:.2f}x")
    failures = baseline["bad"] + loaded["bad"]
    print("5xx other than documented 503 shedding:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
