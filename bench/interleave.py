"""Interleaved multi-user decoding: 4 concurrent requests against the same 4 one by one.

    .venv/bin/python bench/interleave.py [--users 4] [--tokens 64] [--rounds 2] [--model PATH]

One engine (n_parallel = users). Serial: each request is submitted after the previous one
finished. Concurrent: all are submitted at once and decode in one batch per step. Both
are greedy, with the end-of-generation tokens banned so every request runs its full
length; aggregate tok/s = generated tokens / wall time (prefill included in both).
Rounds alternate the two modes; the best round of each is compared. Target: >= 2.0x.
Also printed: tokens per CPU second of this process, a ratio that other processes
competing for the cores disturb much less than wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

PROMPTS = ("Write a poem about the sea:", "List the planets of the solar system:",
           "Explain how a bicycle works:", "Describe a busy market in the morning:",
           "Give advice to a new gardener:", "Tell the story of a lost key:",
           "Summarise the rules of chess:", "Describe the smell of rain:")


def requests(engine, users: int, tokens: int):
    from node.engine.types import GenerationRequest, SamplingParams

    ban = {t: float("-inf") for t in engine.model_info.eog_tokens}
    sampling = SamplingParams(temperature=0.0, logit_bias=ban)
    return [GenerationRequest(tuple(engine.tokenize(PROMPTS[i % len(PROMPTS)])), max_tokens=tokens,
                              sampling=sampling) for i in range(users)]


def run(engine, reqs, concurrent: bool) -> tuple[float, float, float]:
    """(tokens per wall second, tokens per CPU second of this process, llama_decode ms per step)."""
    before = engine.stats()
    start, cpu = time.perf_counter(), time.process_time()
    generated = 0
    if concurrent:
        handles = [engine.submit(r) for r in reqs]
        for h in handles:
            generated += list(h.iter_sync(timeout=900))[-1].completion_tokens
    else:
        for r in reqs:
            generated += list(engine.submit(r).iter_sync(timeout=900))[-1].completion_tokens
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = engine.stats()
    decode_ms = (after["decode_ms"] - before["decode_ms"]) / max(1, after["steps"] - before["steps"])
    return generated / wall, generated / cpu, decode_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))

    from node.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path=args.model or default_model(), n_ctx=2048, n_parallel=args.users))
    serial, together = [], []
    try:
        reqs = requests(engine, args.users, args.tokens)
        run(engine, reqs[:1], concurrent=False)  # warm-up
        for r in range(args.rounds):
            serial.append(run(engine, reqs, concurrent=False))
            together.append(run(engine, reqs, concurrent=True))
            print(f"round {r + 1}: one by one {serial[-1][0]:6.1f} tok/s   together {together[-1][0]:6.1f} tok/s")
    finally:
        engine.close()
    best_serial, best_together = max(r[0] for r in serial), max(r[0] for r in together)
    cpu_serial, cpu_together = max(r[1] for r in serial), max(r[1] for r in together)
    # The raw batch limit: users x (llama_decode of one token) / (llama_decode of one step of
    # all users), from the engine's own timing of llama_decode alone in this run.
    decode_one, decode_all = min(r[2] for r in serial), min(r[2] for r in together)
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.users} requests x {args.tokens} tokens, best of {args.rounds}:")
    print(f"  one after another   {best_serial:6.1f} tok/s aggregate")
    print(f"  interleaved         {best_together:6.1f} tok/s aggregate")
    print(f"  ratio               {best_together / best_serial:6.2f}x  (target >= 2.0)")
    print(f"  per CPU second      {cpu_serial:6.1f} vs {cpu_together:6.1f} tok/cpu-s, "
          f"ratio {cpu_together / cpu_serial:.2f}x (less sensitive to other load on the machine)")
    print(f"  llama_decode alone  {decode_one:6.2f} ms for 1 token, {decode_all:6.2f} ms for a step of "
          f"{args.users}: raw batch limit {args.users * decode_one / decode_all:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
