"""The Conclave: its wall time, the samples adaptive stopping saves, and the accuracy it buys.

    .venv/bin/python bench/conclave.py [--n 5] [--tokens 24] [--rounds 1] [--items 120] [--model PATH]

One engine (12 slots, no speculation so every mode decodes the same way), the same code
path as `reame run --conclave N` (node/serving/conclave/runner.py), all in one run:

1. The easy set (few-shot copying of a number: short answers that end by themselves, and
   candidates that agree), per prompt: one plain greedy answer; the Conclave of N as it
   runs by default (adaptive: an absolute majority of N started, the rest only on
   disagreement; a majority stops the others); the Conclave with all N started; the N
   candidate requests one after another. Printed: samples started and tokens decoded with
   adaptive stopping against all N, whether the answers agree, and the wall time of the
   Conclave against one answer (target <= 2.0x) and against N answers one after another
   (target >= 2.5x faster).
2. The worst case: one prompt, `--tokens` tokens per answer with end-of-generation banned,
   all N started: every candidate runs its whole length and nobody agrees early. The same
   three timings (one answer, the Conclave, N one after another).
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

from bench.host import print_header  # noqa: E402
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


async def worst_case(bench: Bench, tokens: int, rounds: int) -> None:
    request = bench.request(WALL_PROMPT, tokens, ban_eog=True)
    await bench.plain(dataclasses.replace(request, max_tokens=4))  # warm-up
    one, together, apart = [], [], []
    for r in range(rounds):
        one.append(await timed(bench.plain(request)))
        together.append(await timed(bench.conclave(request, adaptive=False)))
        apart.append(await timed(bench.serial(request)))
        print(f"  round {r + 1}: one answer {one[-1][0]:6.2f} s   conclave of {bench.n} {together[-1][0]:6.2f} s   "
              f"{bench.n} one after another {apart[-1][0]:6.2f} s   (load {os.getloadavg()[0]:.1f})", flush=True)
    report(f"worst case: all {bench.n} candidates run {tokens} tokens (end of generation banned), "
           f"best of {rounds}", bench.n, *(min(times) for times in (one, together, apart)))


def report(title: str, n: int, one: tuple[float, float], conclave: tuple[float, float],
           apart: tuple[float, float]) -> None:
    (t1, c1), (tn, cn), (ts, cs) = one, conclave, apart
    print(f"{title} (load {os.getloadavg()[0]:.1f}):")
    print(f"  one answer {t1:.2f} s, conclave {tn:.2f} s, {n} one after another {ts:.2f} s")
    print(f"  conclave / one answer        {tn / t1:5.2f}x  (target <= 2.0)")
    print(f"  one after another / conclave {ts / tn:5.2f}x  (target >= 2.5)")
    print(f"  CPU seconds of this process (less sensitive to other load): {c1:.2f} / {cn:.2f} / {cs:.2f}: "
          f"{cn / c1:.2f}x one answer, {cs / cn:.2f}x faster than one after another", flush=True)


async def easy(bench: Bench) -> None:
    """Per prompt: one plain answer, the Conclave (adaptive), the Conclave with all N started,
    and the N candidate requests one after another."""
    started = {True: 0, False: 0}
    tokens = {True: 0, False: 0}
    times = {"one": [0.0, 0.0], "adaptive": [0.0, 0.0], "fixed": [0.0, 0.0], "apart": [0.0, 0.0]}
    same = 0

    def add(name: str, measured: tuple[float, float]) -> None:
        times[name][0] += measured[0]
        times[name][1] += measured[1]

    await bench.plain(bench.request(EASY[0], 2))  # warm-up
    for text in EASY:
        request = bench.request(text, 6, stop=("\n",))
        add("one", await timed(bench.plain(request)))
        answers = {}
        for adaptive in (True, False):
            outcome: list = []

            async def run(adaptive: bool = adaptive, into: list = outcome) -> None:
                into.extend(await bench.conclave(request, adaptive=adaptive))

            add("adaptive" if adaptive else "fixed", await timed(run()))
            started[adaptive] += outcome[0].started
            tokens[adaptive] += outcome[1]
            answers[adaptive] = outcome[0].winner.text.strip()
        add("apart", await timed(bench.serial(request)))
        same += answers[True] == answers[False]
    k = len(EASY)
    print(f"easy set, {k} prompts (few-shot copying of a number, answers of a few tokens), N = {bench.n} "
          f"(load {os.getloadavg()[0]:.1f}):")
    print(f"  samples started   adaptive {started[True]:3d}  vs all N {started[False]:3d}  "
          f"({1 - started[True] / started[False]:.0%} fewer)")
    print(f"  tokens decoded    adaptive {tokens[True]:3d}  vs all N {tokens[False]:3d}")
    print(f"  same answer       {same}/{k}")
    print(f"  seconds           adaptive {times['adaptive'][0]:5.1f} vs all N {times['fixed'][0]:5.1f}", flush=True)
    as_pair = {name: (value[0], value[1]) for name, value in times.items()}
    report(f"wall on the easy set, summed over {k} prompts, the Conclave adaptive", bench.n,
           as_pair["one"], as_pair["adaptive"], as_pair["apart"])


async def accuracy(bench: Bench, count: int) -> None:
    from node.serving.conclave.vote import answer_key

    items = additions(count)
    right = {"greedy": 0, "conclave": 0}
    started = 0
    done: list[int] = []
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
            done.append(1)
            if len(done) % 20 == 0:
                print(f"  {len(done)}/{count} items: greedy {right['greedy']}, conclave {right['conclave']} right",
                      flush=True)

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
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--only", choices=("easy", "worst", "accuracy"), help="one part only")
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))

    from node.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path=args.model or default_model(), n_ctx=4096, n_parallel=12,
                                 max_queue=64))
    bench = Bench(engine, args.n)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine)")
    try:
        if args.only in (None, "easy"):
            asyncio.run(easy(bench))
        if args.only in (None, "worst"):
            asyncio.run(worst_case(bench, args.tokens, args.rounds))
        if args.only in (None, "accuracy"):
            asyncio.run(accuracy(bench, args.items))
    finally:
        engine.close()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
