"""Where a batch's step time goes, with speculation off and on: the 4-user mixes of
bench/speculation.py, each step split into its parts.

    .venv/bin/python bench/step_profile.py [--tokens 48] [--rounds 2] [--mix prose|repetitive]

Per step (the engine thread's `_step`): planning (the speculator's `plan`: asking the sources
for drafts and choosing rows), the decode itself (`llama_decode`), consuming the logits
(sampling, verifying drafts, KV trims, the speculator's `verified`), and the rest of the step
(admission, batch filling, bookkeeping), by step size. Then, on the idle engine, the decode time
of 4-sequence steps with 0-12 extra rows and of 1-sequence steps, by size: the real marginal
cost of a drafted row inside a 4-sequence step, printed beside what the controller prices it at. Timings wrap the scheduler's own methods; nothing in the engine changes.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.speculation import PARAGRAPH, DOCUMENT, PROSE, timed  # noqa: E402

PARTS = ("plan", "decode", "consume", "rest")


class Recorder:
    """Per-step part timings, collected while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self.current[part] = self.current.get(part, 0.0) + seconds


def instrument(recorder: Recorder) -> None:
    from node.engine import scheduler as sched
    from node.speculative.controller import Controller

    def wrap(cls, name: str, part: str) -> None:
        original = getattr(cls, name)

        def timed_method(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                recorder.add(part, time.perf_counter() - t0)

        setattr(cls, name, timed_method)

    wrap(Controller, "plan", "plan")
    wrap(sched.Scheduler, "_consume", "consume")
    original_decode = sched.Scheduler._decode

    def decode(self, entries):
        ctx = self._ctx
        inner = ctx.decode

        def timed_decode(batch):
            t0 = time.perf_counter()
            try:
                return inner(batch)
            finally:
                recorder.add("decode", time.perf_counter() - t0)

        ctx.decode = timed_decode
        try:
            return original_decode(self, entries)
        finally:
            del ctx.decode

    sched.Scheduler._decode = decode
    original_step = sched.Scheduler._step

    def step(self):
        recorder.current = {}
        t0 = time.perf_counter()
        result = original_step(self)
        total = time.perf_counter() - t0
        if recorder.on and "decode" in recorder.current:
            entry = dict(recorder.current)
            entry["total"] = total
            entry["rest"] = total - sum(entry.get(p, 0.0) for p in PARTS if p != "rest")
            entry.update(self._profile_shape)
            recorder.steps.append(entry)
        return result

    sched.Scheduler._step = step
    original_plan = sched.Scheduler._plan

    def plan(self):
        entries = original_plan(self)
        decoding = [e for e in entries if e.decoding]
        self._profile_shape = {"n_seqs": float(len(decoding)), "n_tokens": float(sum(len(e.tokens) for e in decoding)),
                               "drafted": float(sum(len(e.tokens) - 1 for e in decoding)),
                               "prefill": float(sum(len(e.tokens) for e in entries if not e.decoding))}
        return entries

    sched.Scheduler._plan = plan


def summary(label: str, steps: list[dict[str, float]]) -> list[str]:
    four = [s for s in steps if s["n_seqs"] == 4 and s["prefill"] == 0]
    lines = [f"{label}: {len(steps)} steps, {len(four)} decode-only steps of 4 sequences"]
    if not four:
        return lines
    total = sum(s["total"] for s in four)
    drafted = sum(s["drafted"] for s in four)
    parts = "  ".join(f"{p} {1000 * sum(s.get(p, 0.0) for s in four) / len(four):6.2f}" for p in PARTS)
    lines.append(f"  per 4-sequence step (ms): {parts}  total {1000 * total / len(four):6.2f}; "
                 f"drafted rows a step {drafted / len(four):.2f}")
    slowest = sorted(steps, key=lambda s: -s["total"])[:3]
    lines.append("  slowest steps (ms): " + "; ".join(
        f"{1000 * s['total']:.0f} ({int(s['n_seqs'])} seqs, {int(s['n_tokens'])} tokens, {int(s['prefill'])} prefill, "
        f"decode {1000 * s['decode']:.0f}, plan {1000 * s.get('plan', 0.0):.1f})" for s in slowest))
    wall = sum(s["total"] for s in steps)
    lines.append(f"  all steps together: {wall:.2f} s")
    by_size: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
    for s in four:
        by_size[int(s["n_tokens"])].append(s)
    for size in sorted(by_size):
        group = by_size[size]
        med = {p: 1000 * statistics.median(s.get(p, 0.0) for s in group) for p in (*PARTS, "total")}
        lines.append(f"  {size:3d} tokens x{len(group):4d}: " +
                     "  ".join(f"{p} {med[p]:6.2f}" for p in (*PARTS, "total")))
    return lines


def step_sizes(engine, rounds: int = 8) -> list[str]:
    """Decode time by size of 4-sequence steps (4 tokens and 0-12 extra rows on one sequence) and
    of 1-sequence steps, rounds interleaved, medians: the real marginal cost of a drafted row.
    Run while the engine is idle (its thread waits; the context is not in use)."""
    scheduler = engine._scheduler
    ctx, batch = scheduler._ctx, scheduler._batch
    base = 64
    for slot in scheduler._budget.drop_residents():  # finished requests' resident prefixes hold slots
        ctx.seq_rm(slot)
    for slot in range(4):
        ctx.seq_rm(slot)
    batch.clear()
    for slot in range(4):
        batch.add([1] + [100 + slot] * (base - 1), 0, slot, logits="none")
    assert ctx.decode(batch) == 0
    shapes = [(1, r) for r in range(9)] + [(4, r) for r in range(13)]
    times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for round_ in range(rounds + 1):
        for n_seqs, extra in shapes:
            batch.clear()
            for slot in range(n_seqs):
                batch.add([300 + slot] * (1 + (extra if slot == 0 else 0)), base, slot, logits="all")
            t0 = time.perf_counter()
            assert ctx.decode(batch) == 0
            elapsed = time.perf_counter() - t0
            for slot in range(n_seqs):
                ctx.seq_rm(slot, base, -1)
            if round_:  # the first round warms every shape up
                times[(n_seqs, extra)].append(elapsed)
    for slot in range(4):
        ctx.seq_rm(slot)
    lines = [f"decode time by step size (medians of {rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}):"]
    for n_seqs in (1, 4):
        cells = [(n_seqs + extra, 1000 * statistics.median(times[(n_seqs, extra)]))
                 for (seqs, extra) in shapes if seqs == n_seqs]
        lines.append(f"  {n_seqs} sequence{'s' if n_seqs > 1 else ''}: " +
                     "  ".join(f"{size}:{ms:.1f}" for size, ms in cells) + " ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mix", choices=("prose", "repetitive"), default="prose")
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    print_header(args.model)
    recorder = Recorder()
    instrument(recorder)

    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest

    controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=16, n_parallel=4))
    engine = Engine(EngineConfig(model_path=args.model or default_model(), n_ctx=8192, n_parallel=4, max_draft=16,
                                 speculator=controller))
    texts = list(PROSE) if args.mix == "prose" else [
        f"Rewrite the following paragraph, keeping every sentence:\n\n{PARAGRAPH}\n\nRewritten:\n",
        f"Invoice text:\n{DOCUMENT}\nCopy the invoice text exactly:\n",
        f"Document:\n{PARAGRAPH}\n\nQuote the first three sentences exactly:\n\"",
        "Write the welcome message for new members of the Vellmar rowing club, with the rules of the boathouse:"]
    try:
        deadline = time.monotonic() + 60
        while not controller.costs.measured and time.monotonic() < deadline:
            time.sleep(0.1)
        timed(engine, ["Hello"], 4, False)
        print(f"controller cost line: {controller.costs.line().describe()}")
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for speculation in (False, True):
                recorder.on, recorder.steps = True, []
                rate, _ = timed(engine, texts, args.tokens, speculation, concurrent=True)
                recorder.on = False
                runs[speculation] += recorder.steps
                rates[speculation].append(rate)
        print(f"load {os.getloadavg()[0]:.1f}; controller cost line now: {controller.costs.line().describe()}")
        for speculation in (False, True):
            label = f"speculation {'on ' if speculation else 'off'} ({', '.join(f'{r:.1f}' for r in rates[speculation])} tok/s)"
            for line in summary(label, runs[speculation]):
                print(line)
        for line in step_sizes(engine):
            print(line)
        print(f"the controller prices a step of 4 + r tokens at: " +
              "  ".join(f"{4 + r}:{controller.costs.seconds(4 + r) * 1000:.1f}" for r in range(13)) + " ms")
    finally:
        engine.close()
    for name, stats in controller.stats.snapshot().items():
        print(f"source {name}: drafted {stats['drafted']}, kept {stats['accepted']} ({stats['acceptance']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
