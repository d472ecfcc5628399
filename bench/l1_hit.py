"""L1 hit against miss: the same deterministic 64-token request over HTTP, computed then cached.

    .venv/bin/python bench/l1_hit.py [--misses 5] [--hits 300] [--model PATH] [--api completions|chat|ollama|responses|all]

A node process (embedded archive) answers `--misses` distinct greedy requests of up to 64
tokens (each a miss: the model runs; this is the baseline), then the last of them `--hits`
times more over one keep-alive connection (each a hit: the archive answers), through OpenAI's
/v1/completions (default), /v1/chat/completions, Ollama's /api/chat or the Responses API.
Prints miss and hit latency (p50, p99) and the ratio of the p50s, per API.
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


def prompt_of(number: int) -> str:
    start = 10 + number * 100
    return ", ".join(str(start + i) for i in range(8)) + ","


NO_END = {"1": -100, "106": -100}  # no early end where the API takes a logit bias: 64-token answers
APIS = {  # name -> (route, body of request n, the answer's text)
    "completions": ("/v1/completions",
                    lambda n: {"model": "gemma3-270m", "prompt": prompt_of(n), "max_tokens": 64, "temperature": 0,
                               "logit_bias": NO_END},
                    lambda payload: payload["choices"][0]["text"]),
    "chat": ("/v1/chat/completions",
             lambda n: {"model": "gemma3-270m", "messages": [{"role": "user", "content": prompt_of(n)}],
                        "max_tokens": 64, "temperature": 0, "logit_bias": NO_END},
             lambda payload: payload["choices"][0]["message"]["content"]),
    "ollama": ("/api/chat",
               lambda n: {"model": "gemma3-270m", "messages": [{"role": "user", "content": prompt_of(n)}],
                          "stream": False, "options": {"temperature": 0, "num_predict": 64}},
               lambda payload: payload["message"]["content"]),
    "responses": ("/v1/responses",
                  lambda n: {"model": "gemma3-270m", "input": prompt_of(n), "max_output_tokens": 64,
                             "temperature": 0, "store": False},
                  lambda payload: payload["output"][0]["content"][0]["text"]),
}


async def timed(session: aiohttp.ClientSession, url: str, route: str, body: dict) -> tuple[float, str, dict]:
    started = time.perf_counter()
    async with session.post(f"{url}{route}", json=body) as response:
        payload = await response.json()
        elapsed = time.perf_counter() - started
        assert response.status == 200, payload
        return elapsed, response.headers["X-Reame-Cache"], payload


async def run(url: str, api: str, misses: int, hits: int) -> None:
    route, body, text_of = APIS[api]
    async with aiohttp.ClientSession() as session:
        miss_times = []
        for number in range(misses):
            elapsed, cache, payload = await timed(session, url, route, body(number + 1000 * len(api)))
            assert cache == "miss", cache
            miss_times.append(elapsed)
        await asyncio.sleep(0.2)  # the last answer's archive write happens off the request path
        hit_times = []
        expected = text_of(payload)
        for _ in range(hits):
            elapsed, cache, hit = await timed(session, url, route, body(misses - 1 + 1000 * len(api)))
            assert cache == "hit" and text_of(hit) == expected
            hit_times.append(elapsed)
    miss_p50, hit_p50 = statistics.median(miss_times), statistics.median(hit_times)
    print(f"{api}: {route}")
    print(f"  miss (model runs, <= 64 tokens): p50 {miss_p50 * 1000:9.1f} ms   p99 "
          f"{percentile(miss_times, 0.99) * 1000:9.1f} ms   ({misses} requests)")
    print(f"  hit  (archive answers)         : p50 {hit_p50 * 1000:9.3f} ms   p99 "
          f"{percentile(hit_times, 0.99) * 1000:9.3f} ms   ({hits} requests)")
    print(f"  hit is {miss_p50 / hit_p50:,.0f}x faster than miss (target >= 300x); hit p50 target < 3 ms: "
          f"{'met' if hit_p50 < 0.003 else 'NOT met'}", flush=True)


async def run_all(url: str, apis: list[str], misses: int, hits: int) -> None:
    async with aiohttp.ClientSession() as session:  # warm the engine up
        await timed(session, url, "/v1/completions", {**APIS["completions"][1](999), "max_tokens": 4})
    for api in apis:
        await run(url, api, misses, hits)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", type=int, default=5)
    parser.add_argument("--hits", type=int, default=300)
    parser.add_argument("--model", help="GGUF path (default: the offline gemma3-270m)")
    parser.add_argument("--api", choices=(*APIS, "all"), default="completions")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    with node_process(args.model or default_model()) as url:
        asyncio.run(run_all(url, list(APIS) if args.api == "all" else [args.api], args.misses, args.hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
