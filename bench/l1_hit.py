"""L1 hit against miss: the same deterministic 64-token request over HTTP, computed then cached.

    .venv/bin/python bench/l1_hit.py [--misses 5] [--hits 300] [--model PATH]

A node process (embedded archive) answers `--misses` distinct greedy /v1/completions
requests of 64 tokens (each a miss: the model runs; this is the baseline), then the last of
them `--hits` times more over one keep-alive connection (each a hit: the archive answers).
Prints miss and hit latency (p50, p99) and the ratio of the p50s.
Targets: hit p50 under 3 ms, and at least 300x faster than the miss.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host import print_header  # noqa: E402
from node_process import default_model, node_process, percentile  # noqa: E402


def request(number: int) -> dict:
    start = 10 + number * 100
    prompt = ", ".join(str(start + i) for i in range(8)) + ","
    return {"model": "gemma3-270m", "prompt": prompt, "max_tokens": 64, "temperature": 0,
            "logit_bias": {"1": -100, "106": -100}}  # no early end: every answer is 64 tokens


async def timed(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, str, dict]:
    started = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as response:
        payload = await response.json()
        elapsed = time.perf_counter() - started
        assert response.status == 200, payload
        return elapsed, response.headers["X-Reame-Cache"], payload


async def run(url: str, misses: int, hits: int) -> None:
    async with aiohttp.ClientSession() as session:
        await timed(session, url, {**request(999), "max_tokens": 4})  # warm the engine up
        miss_times = []
        for number in range(misses):
            elapsed, cache, payload = await timed(session, url, request(number))
            assert cache == "miss", cache
            assert payload["usage"]["completion_tokens"] == 64, payload["usage"]
            miss_times.append(elapsed)
        await asyncio.sleep(0.2)  # the last answer's archive write happens off the request path
        hit_times = []
        expected = payload["choices"][0]["text"]
        for _ in range(hits):
            elapsed, cache, hit = await timed(session, url, request(misses - 1))
            assert cache == "hit" and hit["choices"][0]["text"] == expected
            assert hit["usage"]["completion_tokens"] == 64
            hit_times.append(elapsed)
    miss_p50, hit_p50 = statistics.median(miss_times), statistics.median(hit_times)
    print(f"miss (model runs, 64 tokens): p50 {miss_p50 * 1000:9.1f} ms   p99 {percentile(miss_times, 0.99) * 1000:9.1f} ms"
          f"   ({misses} requests)")
    print(f"hit  (archive answers)      : p50 {hit_p50 * 1000:9.3f} ms   p99 {percentile(hit_times, 0.99) * 1000:9.3f} ms"
          f"   ({hits} requests)")
    print(f"hit is {miss_p50 / hit_p50:,.0f}x faster than miss (target >= 300x); hit p50 target < 3 ms: "
          f"{'met' if hit_p50 < 0.003 else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", type=int, default=5)
    parser.add_argument("--hits", type=int, default=300)
    parser.add_argument("--model", help="GGUF path (default: the offline gemma3-270m)")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    with node_process(args.model or default_model()) as url:
        asyncio.run(run(url, args.misses, args.hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
