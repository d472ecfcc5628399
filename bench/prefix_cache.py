"""Prefix KV cache: time to first token for 20 questions about one ~2,000-token document.

    .venv/bin/python bench/prefix_cache.py [--questions 20] [--model PATH]

Four runs, each in its own process (so "after a restart" is a real restart):
  off   no prefix cache: every question prefills the whole document;
  ram   the document is warmed once, then every question restores it from RAM (this run also
        pushes its states to ARCA, a `reame arca` process the bench starts);
  disk  a new process over the same cache directory, RAM tier off: every question restores
        from a disk file;
  l3    a second node with an empty cache directory: the first question fetches the
        document's state from ARCA (L3, over RESP with the node's 200 ms timeout); later
        questions find it locally.
Prints TTFT per question, the totals, and the speed-ups against `off`. Targets: disk >= 30x,
l3 >= 10x. The disk run reads files the page cache still holds (they were just written).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from arca.launch import spawn_arca  # noqa: E402  (after the checkout is on the path)
from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

BLOCK_TOKENS = 32
SUBJECTS = ("The northern depot", "The river crossing", "The eastern mill", "The harbour office",
            "The hill farm", "The old quarry", "The rail yard", "The south market")
EVENTS = ("received {n} crates of tools", "reported {n} workers absent", "shipped {n} tonnes of grain",
          "repaired {n} metres of fence", "logged {n} hours of overtime", "sold {n} barrels of oil")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


def document() -> str:
    lines = ["Operations diary for the spring quarter, kept by the regional office."]
    for week in range(1, 19):
        for d, day in enumerate(DAYS):
            subject = SUBJECTS[(week * 7 + d * 3) % len(SUBJECTS)]
            event = EVENTS[(week + d * 5) % len(EVENTS)].format(n=(week * 13 + d * 29) % 97 + 3)
            lines.append(f"Week {week}, {day}: {subject} {event}.")
    return "\n".join(lines) + "\n\n"


def questions(count: int) -> list[str]:
    out = []
    for i in range(count):
        subject = SUBJECTS[i % len(SUBJECTS)].lower()
        out.append(f"Question {i + 1}: in week {i % 18 + 1}, what did {subject} do? Answer:")
    return out


async def run_phase(args: argparse.Namespace) -> dict:
    from node.archive.client import RemoteArchive
    from node.cache import FleetTier, PrefixCache, PrefixCacheConfig, engine_identity
    from node.engine.engine import Engine, EngineConfig
    from node.models.fingerprint import model_fingerprint
    from node.engine.types import GenerationRequest, SamplingParams

    cache = fleet = archive = None
    if args.phase != "off":
        identity = engine_identity(model_fingerprint(args.model), "f16")
        # The disk run keeps no RAM tier, so every question is a restore from a disk file.
        ram_bytes = 0 if args.phase == "disk" else 512 << 20
        config = PrefixCacheConfig(directory=args.cache_dir, block_tokens=BLOCK_TOKENS, ram_bytes=ram_bytes)
        cache = PrefixCache(identity, config)
    if args.phase in ("ram", "l3"):
        archive = RemoteArchive("127.0.0.1", args.arca_port)  # the node's default 200 ms timeout
        await archive.start()
        fleet = FleetTier(cache, archive)
    engine = Engine(EngineConfig(model_path=args.model, n_ctx=4096, n_threads=args.threads, n_parallel=1,
                                 n_batch=512, n_ubatch=512, kv_type="f16", prefix_cache=cache))
    loop = asyncio.get_running_loop()
    doc = document()
    prompts = [engine.tokenize(doc + q) for q in questions(args.questions)]

    async def ttft(tokens: list[int]) -> float:
        started = time.perf_counter()
        if fleet is not None and args.phase == "l3":
            await fleet.prefetch(tokens)
        request = GenerationRequest(prompt_tokens=tuple(tokens), max_tokens=1,
                                    sampling=SamplingParams(temperature=0.0))
        async for _event in engine.submit(request, loop):
            return time.perf_counter() - started
        raise RuntimeError("no event")

    await ttft(engine.tokenize("Hello.")[:8])  # page the weights in, outside the timings
    warm_s = None
    if args.phase == "ram":  # warm-ahead: the document alone, as POST /v1/warm would
        common = len(_common_prefix(prompts))
        warm_s = await ttft(prompts[0][: common + 1])
    times = [await ttft(tokens) for tokens in prompts]
    result = {"ttft": times, "prompt_tokens": len(prompts[0]), "warm_s": warm_s}
    if cache is not None:
        cache.flush()
        if fleet is not None:
            await fleet.drain()
        result["stats"] = cache.stats()
    engine.close()
    if cache is not None:
        cache.close()
    if archive is not None:
        await archive.close()
    return result


def _common_prefix(prompts: list[list[int]]) -> list[int]:
    first = prompts[0]
    n = 0
    while n < len(first) and all(len(p) > n and p[n] == first[n] for p in prompts):
        n += 1
    return first[:n]


def spawn(phase: str, model: Path, work: Path, node: str, count: int, threads: int, arca_port: int) -> dict:
    command = [sys.executable, __file__, "--phase", phase, "--model", str(model), "--questions", str(count),
               "--threads", str(threads),
               "--cache-dir", str(work / node), "--arca-port", str(arca_port)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict], count: int) -> None:
    names = list(results)
    print(f"prompt: {results['off']['prompt_tokens']} tokens (document + question), block {BLOCK_TOKENS} tokens")
    print("question " + "".join(f"{name:>10}" for name in names) + "   (TTFT, ms)")
    for i in range(count):
        print(f"{i + 1:>8} " + "".join(f"{results[n]['ttft'][i] * 1000:>10.1f}" for n in names))
    totals = {n: sum(results[n]["ttft"]) for n in names}
    medians = {n: statistics.median(results[n]["ttft"]) for n in names}
    print("   total " + "".join(f"{totals[n]:>9.2f}s" for n in names))
    print("  median " + "".join(f"{medians[n] * 1000:>10.1f}" for n in names))
    off = totals["off"]
    for name in names[1:]:
        print(f"{name:>5}: {off / totals[name]:6.1f}x faster than off (total TTFT), "
              f"{medians['off'] / medians[name]:6.1f}x (median TTFT)")
    if results["ram"].get("warm_s") is not None:
        print(f"warm-ahead of the document (one cold prefill): {results['ram']['warm_s']:.2f}s")
    for name in names[1:]:
        stats = results[name].get("stats", {})
        hits = (stats.get("ram_hits") or 0) + (stats.get("disk_hits") or 0)
        lookup_ms = 1000 * stats.get("restore_seconds", 0.0) / max(hits, 1)
        print(f"{name:>5} cache: ram_hits={stats.get('ram_hits')} disk_hits={stats.get('disk_hits')} "
              f"fleet_hits={stats.get('fleet_hits')} tokens_restored={stats.get('tokens_restored')} "
              f"tokens_prefilled={stats.get('tokens_prefilled')} lookup+read+verify={lookup_ms:.1f} ms/hit")
    first_off = results["off"]["ttft"][0]
    print(f"first question: off {first_off * 1000:.0f} ms, l3 (fetched from the archive) "
          f"{results['l3']['ttft'][0] * 1000:.0f} ms = {first_off / results['l3']['ttft'][0]:.1f}x")
    print(f"load average during the run: {os.getloadavg()[1]:.1f} on {os.cpu_count()} cores "
          "(other processes slow every mode; compare ratios)")
    print(f"targets: disk >= 30x -> {off / totals['disk']:.1f}x; "
          f"l3 >= 10x -> {first_off / results['l3']['ttft'][0]:.1f}x on the fetching question")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--phase", choices=("off", "ram", "disk", "l3"))
    parser.add_argument("--cache-dir", type=Path)
    parser.add_argument("--arca-port", type=int)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    if args.phase:
        print(json.dumps(asyncio.run(run_phase(args))))
        return
    model = args.model or default_model()
    with tempfile.TemporaryDirectory(prefix="reame-bench-prefix-") as tmp:
        work = Path(tmp)
        arca, arca_port = spawn_arca(work / "arca")
        results = {}
        try:
            for phase, node in (("off", "a"), ("ram", "a"), ("disk", "a"), ("l3", "b")):
                print(f"running {phase} ...", file=sys.stderr, flush=True)
                results[phase] = spawn(phase, model, work, node, args.questions, args.threads, arca_port)
        finally:
            arca.terminate()
            arca.wait(timeout=30)
    report(results, args.questions)


if __name__ == "__main__":
    main()
