"""One client's document QA: the same ~1.8k-token page, many questions, one after another.

    .venv/bin/python bench/document_qa.py [--questions 8] [--tokens 16] [--no-build]
        [--llama-server PATH]

Every question after the first shares the whole page with the one before. reame continues
from the slot the last question left (a resident prefix, `[cache] resident`); the baseline in
the same run is the same node with resident prefixes off (the prefix cache's RAM tier
restores the page's last stored boundary instead), and llama.cpp's server (bench/llama_server.py,
4 slots, its prompt cache on as by default; run once as it starts and once with `--swa-full`,
which keeps the sliding-window layers' KV of the whole context so a slot can reuse its prefix
on this model), each with the node's kernels. Greedy /v1/completions, at most --tokens tokens,
natural stops. Reported per server: wall time of all questions and of those after the first,
prompt tokens computed against answered by a cache, and the ratios; text is not compared across
servers (near-ties differ between builds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench import llama_server  # noqa: E402
from bench.host import print_header  # noqa: E402
from bench.node_process import node_server  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.versus_llama_server import Tally, account  # noqa: E402

PAGE = "Warehouse ledger, week 14.\n" + "\n".join(
    f"Entry {i}: crate {('amber', 'birch', 'cobalt', 'dune', 'ember', 'flint')[i % 6]}-{i * 7 % 31} left bay "
    f"{i % 9} at {6 + i % 12} o'clock with {i * 3 % 17 + 2} boxes of "
    f"{('tea', 'rope', 'nails', 'salt', 'wool', 'ink', 'soap')[i % 7]} for {('Ardee', 'Birr', 'Cobh', 'Dunlavin')[i % 4]}."
    for i in range(56))
QUESTIONS = [f"\n\nQuestion: what did entry {n} carry, and where to?\nAnswer:" for n in (12, 40, 7, 55, 3, 28, 61, 19,
                                                                                      33, 46, 2, 50)]


async def ask_all(url: str, n: int, tokens: int) -> tuple[Tally, Tally]:
    """All questions in turn: (the first, the rest)."""
    first, rest = Tally(), Tally()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        for i, question in enumerate(QUESTIONS[:n]):
            tally = first if i == 0 else rest
            body = {"prompt": PAGE + question, "max_tokens": tokens, "temperature": 0.0}
            start = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as response:
                data = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}: {data}")
                account(tally, data, response.headers.get("X-Reame-Cache"))
            tally.seconds += time.perf_counter() - start
    return first, rest


def report(name: str, first: Tally, rest: Tally) -> None:
    print(f"{name:34s} first {first.seconds * 1000:7.0f} ms (prefilled {first.prefilled:5d})  then "
          f"{rest.seconds * 1000:8.0f} ms for the rest: prefilled {rest.prefilled:5d}, a cache answered "
          f"{rest.cache_prompt:6d} prompt tokens, {rest.generated} tokens out  load {os.getloadavg()[0]:.1f}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--llama-server", default=None)
    args = parser.parse_args()
    args.questions = max(2, min(args.questions, len(QUESTIONS)))
    print_header(args.model, threads=None)
    from node.engine.kernels import choose_kernels

    model = args.model or str(default_model())
    extra_buffers = choose_kernels(Path(model)).extra_buffers
    print(llama_server.kernel_line(extra_buffers), flush=True)
    results: dict[str, tuple[Tally, Tally]] = {}
    base_env = {"REAME_CACHE_ENABLED": "true", "REAME_MODEL_EXTRA_BUFFERS": "on" if extra_buffers else "off"}
    for name, resident in (("reame (defaults: resident)", "true"), ("reame, resident prefixes off", "false")):
        with node_server(model, ctx=8192, parallel=4, env={**base_env, "REAME_CACHE_RESIDENT": resident}) as (url, _, _):
            results[name] = asyncio.run(ask_all(url, args.questions, args.tokens))
        report(name, *results[name])
    binary = llama_server.ensure_binary(args.llama_server, build=not args.no_build)
    if binary is None:
        print("llama-server: no binary (--no-build or the build failed); comparison skipped")
    else:
        for label, extra in (("llama-server", []), ("llama-server --swa-full", ["--swa-full"])):
            flags = ["-np", "4", "-c", "8192", *llama_server.kernel_flags(extra_buffers), *extra]
            print(f"# {label}: {' '.join(flags)}", flush=True)
            try:
                with llama_server.running(binary, model, flags) as peer:
                    results[label] = asyncio.run(ask_all(peer, args.questions, args.tokens))
            except RuntimeError as exc:
                print(f"{label}: failed ({str(exc)[-300:]}); skipped", flush=True)
                continue
            report(label, *results[label])
    ours = results["reame (defaults: resident)"]
    for name, (first, rest) in results.items():
        if name == "reame (defaults: resident)":
            continue
        print(f"reame (resident) against {name}: all questions {(first.seconds + rest.seconds) / (ours[0].seconds + ours[1].seconds):5.2f}x "
              f"faster, the questions after the first {rest.seconds / ours[1].seconds:5.2f}x faster", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
