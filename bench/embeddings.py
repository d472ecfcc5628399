"""Embeddings batched against one by one: 256 inputs in one POST /v1/embeddings against 256 single calls.

    .venv/bin/python bench/embeddings.py [--inputs 256] [--model PATH]

A node process (embedded archive, fresh home) embeds `--inputs` distinct short texts in one
request (the engine packs them into batched decodes, one seq id per input), then as many
other distinct texts of the same shape in single requests, one after the other over one
keep-alive connection (each input decoded alone: the baseline), then the first request
again (every input an L1 hit: nothing computed). The two computed sets never share an input,
so neither is helped by the archive. Prints seconds and ms per input of each, and the ratio
of the per-input costs (target: batched faster per input than single calls, ratio > 1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host import print_header  # noqa: E402
from node_process import default_model, node_process  # noqa: E402


def texts(n: int, tag: str) -> list[str]:
    return [f"Note {tag}{i}: the {i}th item of the {tag} list is short." for i in range(n)]


async def embed(session: aiohttp.ClientSession, url: str, inputs: list[str] | str) -> tuple[dict, str]:
    async with session.post(f"{url}/v1/embeddings", json={"input": inputs, "encoding_format": "base64"}) as response:
        payload = await response.json()
        assert response.status == 200, payload
        return payload, response.headers["X-Reame-Cache"]


async def run(url: str, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        await embed(session, url, "warm the embeddings context up")
        batch = texts(n, "b")
        started = time.perf_counter()
        payload, cache = await embed(session, url, batch)
        batched = time.perf_counter() - started
        assert cache == "miss" and len(payload["data"]) == n
        tokens = payload["usage"]["prompt_tokens"]
        started = time.perf_counter()
        for text in texts(n, "s"):
            _, cache = await embed(session, url, text)
            assert cache == "miss"
        single = time.perf_counter() - started
        await asyncio.sleep(0.5)  # the batch's archive writes happen after its answer
        started = time.perf_counter()
        _, cache = await embed(session, url, batch)
        cached = time.perf_counter() - started
        assert cache == "hit", cache
    print(f"{n} inputs, {tokens} tokens ({tokens / n:.1f} per input)")
    print(f"one batched request : {batched:7.2f} s   {batched / n * 1000:7.1f} ms per input")
    print(f"{n} single requests: {single:7.2f} s   {single / n * 1000:7.1f} ms per input")
    print(f"the batch again (L1): {cached:7.3f} s   {cached / n * 1000:7.3f} ms per input")
    print(f"batched is {single / batched:.2f}x faster per input than single calls (target > 1)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--model", help="GGUF path (default: the offline gemma3-270m)")
    args = parser.parse_args()
    print_header(args.model)
    with node_process(args.model or default_model()) as url:
        asyncio.run(run(url, args.inputs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
