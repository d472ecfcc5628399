"""Each decode step of the 4 users' repetitive mix against the cost line: where the time goes.

    .venv/bin/python bench/step_trace.py [--tokens 48] [--rounds 2] [--mix repetitive|prose]

The engine and controller of bench/speculation.py, the same four concurrent requests
(`REPETITIVE_MIX`), plain and speculative in turn, `rounds` times each after one unmeasured
plain run. For every round: wall time, steps, the sum of the decode calls and what the
engine's cost line says those steps cost; for the speculative rounds also each step (its time,
the line's figure, the tokens each sequence put in it, and each verified draft as
source/match:kept/drafted). The line is fitted on one sequence,
so a step of four sequences costing more than it says is the batch's own overhead (attention
over four caches), paid by both modes; a plan that gives rows to one sequence while the others
draft nothing shows in the per-sequence column.

The timing wraps the scheduler's `_decode` from outside (the engine has no per-step log of its
own): each figure is the decode call alone, sampling and bookkeeping included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.speculation import PROSE, REPETITIVE_MIX, timed  # noqa: E402
from node.engine import scheduler  # noqa: E402


def traced_decodes() -> list[tuple[float, list[int], bool]]:
    """Wrap the scheduler's decode call; the list it returns fills with (seconds, tokens per
    sequence, every entry decoding) per call."""
    steps: list[tuple[float, list[int], bool]] = []
    decode = scheduler.Scheduler._decode

    def timed_decode(self, entries):
        t0 = time.perf_counter()
        decode(self, entries)
        steps.append((time.perf_counter() - t0, [len(e.tokens) for e in entries], all(e.decoding for e in entries)))

    scheduler.Scheduler._decode = timed_decode  # type: ignore[method-assign]
    return steps


def traced_verdicts(controller, steps: list) -> dict[int, list[str]]:
    """Wrap the controller's verdict on each verified draft; the dict it returns fills, by the
    index of the step in `steps`, with `source/match:kept/drafted` entries."""
    verdicts: dict[int, list[str]] = {}
    verified = controller.verified

    def traced(seq, draft, accepted):
        verdicts.setdefault(len(steps), []).append(  # inside the decode call, before it is appended
            f"{draft.source[:3]}/{draft.match}:{accepted}/{len(draft.tokens)}")
        verified(seq, draft, accepted)

    controller.verified = traced
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mix", choices=("repetitive", "prose"), default="repetitive",
                        help="the repetitive mix, or the non-repetitive mix's first set of requests (PROSE)")
    args = parser.parse_args()
    print_header(threads=None)

    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest

    steps = traced_decodes()
    controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=16, n_parallel=4))
    verdicts = traced_verdicts(controller, steps)
    engine = Engine(EngineConfig(model_path=default_model(), n_ctx=8192, n_parallel=4, max_draft=16,
                                 speculator=controller))
    try:
        deadline = time.monotonic() + 60
        while not controller.costs.measured and time.monotonic() < deadline:
            time.sleep(0.1)
        timed(engine, ["Hello"], 4, False)
        line = controller.costs
        print(f"cost curve: {line.describe()}")
        texts = list(REPETITIVE_MIX if args.mix == "repetitive" else PROSE)
        timed(engine, texts, args.tokens, False, True)
        for r in range(args.rounds):
            for speculation in (False, True):
                steps.clear()
                t0 = time.perf_counter()
                rate, _ = timed(engine, texts, args.tokens, speculation, True)
                wall = time.perf_counter() - t0
                decoded = sum(s for s, _, _ in steps)
                predicted = sum(line.seconds(sum(tokens)) for _, tokens, _ in steps)
                print(f"round {r + 1}, speculation {'on ' if speculation else 'off'}: {rate:6.1f} tok/s, wall "
                      f"{wall * 1000:5.0f} ms, {len(steps)} steps, decode calls {decoded * 1000:5.0f} ms, "
                      f"the line {predicted * 1000:5.0f} ms ({decoded / predicted:.2f}x), load {os.getloadavg()[0]:.1f}")
                if speculation:
                    for i, (seconds, tokens, decoding) in enumerate(steps):
                        kept = " ".join(verdicts.get(i, [])) or "-"
                        print(f"    {seconds * 1000:6.1f} ms  line {line.seconds(sum(tokens)) * 1000:6.1f} ms  "
                              f"{sum(tokens):3d} tokens  by sequence {tokens}  kept {kept}"
                              f"{'' if decoding else '  (prompt rows in it)'}")
                verdicts.clear()
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
