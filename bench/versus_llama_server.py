"""reame against llama.cpp's own server on a repetitive mixed workload, same kernels, same run.

    .venv/bin/python bench/versus_llama_server.py [--tokens 48] [--clients 4] [--no-build]
        [--llama-server PATH] [--llama-source DIR] [--peers none,ngram-mod,...]

llama-server comes from bench/llama_server.py (built once from the llama.cpp that the installed
llama-cpp-python vendors); with --no-build and no binary, the comparison is skipped and the
bench says so. It runs the node's kernels: `--no-repack` exactly when the node's kernel
verdict (node/engine/kernels.py) is "no extra buffer types", and the node is started with that
verdict set; the header says which.

The workload (4 clients at once, greedy, /v1/completions, natural stops, at most --tokens
tokens): classification of reviews with one instruction, rewrites of a paragraph, questions
over one long document, and exact repeats of earlier requests. Two passes of 16 and 19
requests: the second has new review items, new questions over the same document, the two
rewrites asked with other instructions over the same texts, and 3 exact repeats of the first
pass (one review, one rewrite, one question), so 3 of its 19 requests are repeats.

Servers: reame (a node with its defaults: L1, prefix cache, speculation, embedded archive,
fresh home, the weights in 2 MiB pages where the kernel offers them), and llama-server `-np 4
-c 8192` once per setting in PEERS: no speculation (the model mapped, and read with
`--load-mode none`, as the node reads it: llama.cpp asks for no huge pages either way), and
every speculative type of its own that drafts from the text alone, each with sizes that can
draft within a 48-token answer (ngram-mod's defaults, n_match 24 and n_min 48, cannot: a
draft needs 48 tokens found in a chain, as many as the whole answer). Reported per server and
pass: wall time, tokens generated, and the tokens it computed (prompt tokens prefilled and
tokens generated; prompt tokens a cache answered and whole answers replayed are counted
apart), as tokens per second of wall time beside it, so the wall time splits into what caching
saved and what decoding cost; then reame against the best llama-server setting.
Greedy text is not compared across servers (near-ties differ between builds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench import llama_server  # noqa: E402
from bench.host import print_header  # noqa: E402
from bench.node_process import node_server  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.speculation import DOCUMENT, INSTRUCTION, PARAGRAPH, REVIEWS  # noqa: E402

LONG_DOCUMENT = "\n\n".join([PARAGRAPH, DOCUMENT, PARAGRAPH.replace("Vellmar", "Ostend")])
QUESTIONS = ("Who founded the guild of pilots?", "What is the total due on the invoice?",
             "When does the ferry leave in winter?", "What was the first quay made of?",
             "Which account must the invoice be paid to?", "What happened when the railway arrived?",
             "Who is the contact for the invoice?", "What did the town grow rich on?",
             "Where are the pilots' rules kept?", "How many boxes of yeast were ordered?",
             "What serves the harbour today?", "What date is the invoice?")
REWRITES = (("Rewrite the following paragraph, keeping every sentence:", "Rewritten:"),
            ("Copy the invoice text exactly.", "Copy:"))
REWRITES_SECOND = (("Rewrite the following paragraph in plain words, one sentence for each of its sentences:",
                    "Plainly:"),
                   ("Copy the invoice text exactly, line by line.", "Lines:"))
REPEATED = (0, 8, 10)  # first-pass requests the second pass sends again: a review, a rewrite, a question

# llama-server settings, each with a speculative type that drafts from the text alone at sizes
# that can draft in a 48-token answer (draft lengths 16, as the node's).
PEERS: tuple[tuple[str, list[str]], ...] = (
    ("none", []),
    ("none-read", ["--load-mode", "none"]),  # the model read into memory, as a node with huge pages reads it
    ("ngram-mod", ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2",
                   "--spec-ngram-mod-n-max", "16"]),
    ("ngram-simple", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                      "--spec-ngram-simple-size-m", "16"]),
    ("ngram-map-k", ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "4", "--spec-ngram-map-k-size-m", "16"]),
    ("ngram-map-k4v", ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "4",
                       "--spec-ngram-map-k4v-size-m", "16"]),
    ("ngram-cache", ["--spec-type", "ngram-cache"]),
)


def workload(second: bool) -> list[str]:
    offset = 8 if second else 0
    reviews = [f"{INSTRUCTION}Review: {REVIEWS[(i + offset) % len(REVIEWS)]} (order {2000 + i + offset})\nSentiment:"
               for i in range(8)]
    (paragraph, tail_p), (invoice, tail_i) = REWRITES_SECOND if second else REWRITES
    rewrites = [f"{paragraph}\n\n{PARAGRAPH}\n\n{tail_p}\n", f"{invoice}\n\n{DOCUMENT}\n\n{tail_i}\n"]
    questions = [f"Document:\n{LONG_DOCUMENT}\n\nQuestion: {q}\nAnswer:"
                 for q in QUESTIONS[(6 if second else 0):(12 if second else 6)]]
    prompts = reviews + rewrites + questions
    if second:
        first = workload(False)
        prompts += [first[i] for i in REPEATED]
    return prompts


@dataclass
class Tally:
    """What one server did in one pass."""

    seconds: float = 0.0
    generated: int = 0      # completion tokens served (replayed answers included)
    prefilled: int = 0      # prompt tokens computed
    decoded: int = 0        # completion tokens computed (not replayed)
    cache_prompt: int = 0   # prompt tokens a cache answered
    replayed: int = 0       # whole answers replayed (reame's L1)
    drafted: int = 0        # draft tokens kept (reame: /v1/reame/stats; llama-server: its timings)

    @property
    def computed(self) -> int:
        return self.prefilled + self.decoded

    def add(self, other: "Tally") -> "Tally":
        return Tally(self.seconds + other.seconds, self.generated + other.generated,
                     self.prefilled + other.prefilled, self.decoded + other.decoded,
                     self.cache_prompt + other.cache_prompt, self.replayed + other.replayed,
                     self.drafted + other.drafted)


def account(tally: Tally, data: dict, cache_header: str | None) -> None:
    """Add one /v1/completions answer: reame's usage and X-Reame-Cache, or llama-server's timings."""
    usage = data.get("usage", {})
    prompt = int(usage.get("prompt_tokens", 0))
    completion = int(usage.get("completion_tokens", 0))
    tally.generated += completion
    timings = data.get("timings")
    if cache_header == "hit":  # the whole answer replayed from L1: nothing computed
        tally.replayed += 1
        tally.cache_prompt += prompt
    elif timings is not None:
        prefilled, cached, predicted = llama_server.computed(timings)
        tally.prefilled += prefilled
        tally.cache_prompt += cached
        tally.decoded += predicted
        tally.drafted += int(timings.get("draft_n_accepted", 0))  # present only when it drafted
    else:
        cached = int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        tally.prefilled += prompt - cached
        tally.cache_prompt += cached
        tally.decoded += completion


async def run_pass(url: str, prompts: list[str], tokens: int, clients: int) -> Tally:
    limit = asyncio.Semaphore(clients)
    tally = Tally()

    async def one(session: aiohttp.ClientSession, prompt: str) -> None:
        async with limit:
            body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0.0}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                data = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}: {data}")
                account(tally, data, response.headers.get("X-Reame-Cache"))

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await asyncio.gather(*(one(session, p) for p in prompts))
    tally.seconds = time.perf_counter() - start
    return tally


async def reame_drafts(url: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/reame/stats") as response:
            data = await response.json()
    return int(data["since_start"]["saved"]["drafts"]["tokens"])


def two_passes(url: str, tokens: int, clients: int, *, reame: bool = False) -> dict[str, Tally]:
    before = asyncio.run(reame_drafts(url)) if reame else 0
    first = asyncio.run(run_pass(url, workload(False), tokens, clients))
    middle = asyncio.run(reame_drafts(url)) if reame else 0
    second = asyncio.run(run_pass(url, workload(True), tokens, clients))
    if reame:
        first.drafted = middle - before
        second.drafted = asyncio.run(reame_drafts(url)) - middle
    return {"first": first, "second": second, "total": first.add(second)}


def line(name: str, part: str, t: Tally) -> str:
    rate = t.computed / t.seconds if t.seconds > 0 else 0.0
    decode = t.decoded / t.seconds if t.seconds > 0 else 0.0
    return (f"{name:26s} {part:6s} {t.seconds:7.1f} s  {t.generated:5d} tokens out  computed {t.computed:6d} "
            f"(prefill {t.prefilled:6d} + decode {t.decoded:5d}) = {rate:7.1f} tok/s, decode {decode:5.1f} tok/s; "
            f"cache answered {t.cache_prompt:6d} prompt tokens, {t.replayed} answers; drafts kept {t.drafted}")


def report(name: str, r: dict[str, Tally]) -> None:
    for part in ("first", "second", "total"):
        print(line(name, part, r[part]), flush=True)
    print(f"{'':26s} load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--llama-source", default=None)
    parser.add_argument("--peers", default=",".join(name for name, _ in PEERS))
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    from node.engine.kernels import choose_kernels

    model = args.model or str(default_model())
    extra_buffers = choose_kernels(Path(model)).extra_buffers
    print(llama_server.kernel_line(extra_buffers), flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, dict[str, Tally]] = {}
    env = {"REAME_CACHE_ENABLED": "true", "REAME_MODEL_EXTRA_BUFFERS": "on" if extra_buffers else "off"}
    with node_server(model, ctx=8192, parallel=4, env=env) as (url, _, _):
        results["reame (defaults)"] = two_passes(url, args.tokens, args.clients, reame=True)
    report("reame (defaults)", results["reame (defaults)"])
    binary = llama_server.ensure_binary(args.llama_server, build=not args.no_build, source=args.llama_source)
    if binary is None:
        print("llama-server: no binary (--no-build or the build failed); comparison skipped")
        return 0
    wanted = args.peers.split(",")
    for name, extra in PEERS:
        if name not in wanted:
            continue
        label = f"llama-server {name}"
        flags = ["-np", "4", "-c", "8192", *llama_server.kernel_flags(extra_buffers), *extra]
        print(f"# {label}: {' '.join(flags)}", flush=True)
        unknown = llama_server.unknown_flags(binary, flags)
        if unknown:
            print(f"{label}: this build does not know {' '.join(unknown)}; skipped", flush=True)
            continue
        try:
            with llama_server.running(binary, model, flags) as peer:
                results[label] = two_passes(peer, args.tokens, args.clients)
        except RuntimeError as exc:
            print(f"{label}: failed ({str(exc)[-300:]}); skipped", flush=True)
            continue
        report(label, results[label])
    ours = results["reame (defaults)"]
    theirs = {name: r for name, r in results.items() if name.startswith("llama-server")}
    if not theirs:
        return 0
    best = min(theirs, key=lambda name: theirs[name]["total"].seconds)
    best_second = min(theirs, key=lambda name: theirs[name]["second"].seconds)
    print(f"reame against the best llama-server setting: total {theirs[best]['total'].seconds / ours['total'].seconds:.2f}x "
          f"faster ({best}), second pass {theirs[best_second]['second'].seconds / ours['second'].seconds:.2f}x faster "
          f"({best_second}) (targets >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
