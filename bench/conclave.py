"""The Conclave: its wall time, the samples adaptive stopping saves, and the accuracy it buys.

    .venv/bin/python bench/conclave.py [--n 5] [--tokens 24] [--rounds 2] [--items 120] [--model PATH]

One engine (12 slots, no speculation so every mode decodes the same way), the same code
path as `reame run --best-of N` (node/serving/conclave/runner.py), all in one run:

1. Wall time. One prompt, `--tokens` tokens per answer with end-of-generation banned (every
   candidate runs its whole length and nobody agrees early: the Conclave's worst case):
   one plain greedy answer; a Conclave of N candidates (all N started, one prefill, N-1
   forks, one batch); the same N candidate requests one after another. Rounds alternate;
   the best round of each is compared. Targets: N candidates <= 2.0x one answer, and
   >= 2.5x faster than N answers one after another.
2. Samples decoded on an easy set (few-shot copying a number: candidates agree): adaptive
   stopping (an absolute majority of N started, the rest only on disagreement) against all N
   started, with the decided answers compared.
3. Accuracy on a held-out few-shot set where the model is unsure: `--items` two-digit
   additions (seeded, never the few-shot examples), graded automatically by the vote's own
   answer key (the last number) against the true sum: the plain greedy answer against the
   Conclave's (N candidates, adaptive). Short answers (4 tokens, stop at the line's end),
   two items in flight at a time (a plain answer and a Conclave each).

Printed with the load average: the machine is shared, so wall figures move with other load.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.offline_model import default_model  # noqa: E402

WALL_PROMPT = "Write a short story about a lighthouse keeper:"
EASY = [f"Copy the number.\n7 -> 7\n41 -> 41\n306 -> 306\n{x} ->" for x in
        (12, 5, 88, 230, 64, 9, 17, 451, 3, 76)]
FEW_SHOT = "23 + 45 = 68\n17 + 26 = 43\n58 + 31 = 89\n12 + 14 = 26\n"
SHOTS = {(23, 45), (17, 26), (58, 31), (12, 14)}


def additions(count: int, seed: int = 2026) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    items: list[tuple[int, int]] = []
    while len(items) < count:
        pair = (rng.randint(10, 99), rng.randint(10, 99))
        if pair not in SHOTS and pair not in items:
            items.append(pair)
    return items


class Bench:
    def __init__(self, engine, n: int) -> None:
        self.engine = engine
        self.n = n

    def request(self, text: str, tokens: int, *, ban_eog: bool = False, stop: tuple[str, ...] = ()):
        from node.engine.types import GenerationRequest, SamplingParams

        bias = {t: float("-inf") for t in self.engine.model_info.eog_tokens} if ban_eog else {}
        return GenerationRequest(tuple(self.engine.tokenize(text)), max_tokens=tokens,
                                 sampling=SamplingParams(temperature=0.0, logit_bias=bias), stop=stop)

    async def plain(self, request) -> tuple[str, int]:
        text, finished = await self.engine.submit(request, asyncio.get_running_loop()).collect()
        return text, finished.completion_tokens

    async def conclave(self, request, *, adaptive: bool):
        from node.serving.conclave.runner import ConclavePolicy, ConclaveRun

        loop = asyncio.get_running_loop()
        run = ConclaveRun(lambda reqs, spare, group: self.engine.submit_group(reqs, loop, spare=spare, group=group),
                          request, self.n, ConclavePolicy(adaptive=adaptive))
        run.start()
        outcome = await run.decide()
        tokens = sum(c.finished.completion_tokens for c in run.candidates if c.finished is not None)
        return outcome, tokens

    async def serial(self, request) -> None:
        from node.serving.conclave.runner import ConclavePolicy, candidate_requests

        for candidate in candidate_requests(request, self.n, ConclavePolicy()):
            await self.plain(candidate)


async def timed(coro) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: the engine's threads included)."""
    start, cpu = time.perf_counter(), time.process_time()
    await coro
    return time.perf_counter() - start, time.process_time() - cpu


async def wall(bench: Bench, tokens: int, rounds: int) -> None:
    request = bench.request(WALL_PROMPT, tokens, ban_eog=True)
    await bench.plain(dataclasses.replace(request, max_tokens=4))  # warm-up
    one, together, apart = [], [], []
    for r in range(rounds):
        one.append(await timed(bench.plain(request)))
        together.append(await timed(bench.conclave(request, adaptive=False)))
        apart.append(await timed(bench.serial(request)))
        print(f"  round {r + 1}: one answer {one[-1][0]:6.2f} s   conclave of {bench.n} {together[-1][0]:6.2f} s   "
              f"{bench.n} one after another {apart[-1][0]:6.2f} s   (load {os.getloadavg()[0]:.1f})", flush=True)
    t1, tn, ts = (min(t[0] for t in times) for times in (one, together, apart))
    c1, cn, cs = (min(t[1] for t in times) for times in (one, together, apart))
    print(f"wall, {bench.n} candidates x {tokens} tokens (best of {rounds}, load {os.getloadavg()[0]:.1f}):")
    print(f"  one answer {t1:.2f} s, conclave {tn:.2f} s, one after another {ts:.2f} s")
    print(f"  conclave / one answer        {tn / t1:5.2f}x  (target <= 2.0)")
    print(f"  one after another / conclave {ts / tn:5.2f}x  (target >= 2.5)")
    print(f"  CPU seconds (less sensitive to other load): {c1:.2f} / {cn:.2f} / {cs:.2f}: "
          f"{cn / c1:.2f}x one answer, {cs / cn:.2f}x faster than one after another", flush=True)


async def easy(bench: Bench) -> None:
    started = {True: 0, False: 0}
    tokens = {True: 0, False: 0}
    seconds = {True: 0.0, False: 0.0}
    same = 0
    for text in EASY:
        request = bench.request(text, 6, stop=("\n",))
        answers = {}
        for adaptive in (True, False):
            start = time.perf_counter()
            outcome, decoded = await bench.conclave(request, adaptive=adaptive)
            seconds[adaptive] += time.perf_counter() - start
            started[adaptive] += outcome.started
            tokens[adaptive] += decoded
            answers[adaptive] = outcome.winner.text.strip()
        same += answers[True] == answers[False]
    k = len(EASY)
    print(f"easy set, {k} prompts, N = {bench.n} (load {os.getloadavg()[0]:.1f}):")
    print(f"  samples started   adaptive {started[True]:3d}  vs all N {started[False]:3d}  "
          f"({1 - started[True] / started[False]:.0%} fewer)")
    print(f"  tokens decoded    adaptive {tokens[True]:3d}  vs all N {tokens[False]:3d}")
    print(f"  seconds           adaptive {seconds[True]:5.1f} vs all N {seconds[False]:5.1f}")
    print(f"  same answer       {same}/{k}", flush=True)


async def accuracy(bench: Bench, count: int) -> None:
    from node.serving.conclave.vote import answer_key

    items = additions(count)
    right = {"greedy": 0, "conclave": 0}
    started = 0
    gate = asyncio.Semaphore(2)

    async def one(a: int, b: int) -> None:
        nonlocal started
        async with gate:
            request = bench.request(f"{FEW_SHOT}{a} + {b} =", 4, stop=("\n",))
            (greedy, _), (outcome, _) = await asyncio.gather(bench.plain(request),
                                                             bench.conclave(request, adaptive=True))
            truth = f"number:{a + b}"
            right["greedy"] += answer_key(greedy) == truth
            right["conclave"] += answer_key(outcome.winner.text) == truth
            started += outcome.started

    start = time.perf_counter()
    await asyncio.gather(*(one(a, b) for a, b in items))
    elapsed = time.perf_counter() - start
    print(f"accuracy, {count} held-out two-digit additions, 4-shot, N = {bench.n} "
          f"({elapsed:.0f} s, load {os.getloadavg()[0]:.1f}):")
    print(f"  greedy answer     {right['greedy']:3d}/{count} = {right['greedy'] / count:.1%}")
    print(f"  conclave answer   {right['conclave']:3d}/{count} = {right['conclave'] / count:.1%}  "
          f"({started / count:.1f} candidates started per item)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--only", choices=("wall", "easy", "accuracy"), help="one part only")
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()

    from node.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path=args.model or default_model(), n_ctx=4096, n_parallel=12,
                                 max_queue=64))
    bench = Bench(engine, args.n)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine)")
    try:
        if args.only in (None, "wall"):
            asyncio.run(wall(bench, args.tokens, args.rounds))
        if args.only in (None, "easy"):
            asyncio.run(easy(bench))
        if args.only in (None, "accuracy"):
            asyncio.run(accuracy(bench, args.items))
    finally:
        engine.close()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
