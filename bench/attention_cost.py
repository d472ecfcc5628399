"""What a row of a step costs by the KV cells the batch attends over: the part of a busy
batch's step the verify cost line does not see.

    .venv/bin/python bench/attention_cost.py [--contexts 0,200,400,800] [--repeats 7]

The engine's cost line is calibrated on empty slots (node/speculative/costs.py): each row
attends over a few cells. In service four sequences hold hundreds of tokens each, and with
one unified KV cache every row's attention spans the cells in use. This bench fills each of
four sequences with the same number of context tokens (0 first: the calibration's case),
then times steps of the four sequences with 1, 2, 4, 8 and 17 tokens each (every token with
logits, as a verify step), the median of `repeats` after one unmeasured step. It prints each
step's time at each context, the step of 68 rows against the empty one, and a least-squares
figure for the extra seconds per row per KV cell in use, with the same kernels the node
picks (node/engine/kernels.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from node.engine.kernels import choose_kernels  # noqa: E402
from node.engine.llama import LlamaContext, LlamaModel, TokenBatch  # noqa: E402

SEQS = 4
TOKENS_EACH = (1, 2, 4, 8, 17)
CHUNK = 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="0,200,400,800", help="context tokens per sequence, comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    contexts = sorted({int(c) for c in args.contexts.split(",")} | {0})
    print_header(threads=args.threads)
    path = default_model()
    choice = choose_kernels(path, n_threads=args.threads)
    model = LlamaModel(path, extra_buffers=choice.extra_buffers)
    ctx = LlamaContext(model, n_ctx=SEQS * (max(contexts) + max(TOKENS_EACH)) + 256, n_batch=512, n_ubatch=512,
                       n_seq_max=SEQS, n_threads=args.threads, max_outputs_per_seq=max(TOKENS_EACH))
    batch = TokenBatch(512)
    filler = model.tokenize("The harbour of Vellmar was built " * 200)

    def step(each: int, start: int) -> float:
        batch.clear()
        for seq in range(SEQS):
            batch.add(filler[:each], start, seq, logits="all")
        t0 = time.perf_counter()
        if ctx.decode(batch) != 0:
            raise SystemExit(f"a step of {SEQS} x {each} tokens failed")
        elapsed = time.perf_counter() - t0
        for seq in range(SEQS):
            ctx.seq_rm(seq, start, -1)
        return elapsed

    table: dict[int, dict[int, float]] = {}
    for context in contexts:
        for seq in range(SEQS):
            ctx.seq_rm(seq)
            for done in range(0, context, CHUNK):
                batch.clear()
                batch.add(filler[done:min(context, done + CHUNK)], done, seq, logits="none")
                if ctx.decode(batch) != 0:
                    raise SystemExit(f"prefilling {context} tokens failed")
        row: dict[int, float] = {}
        for each in TOKENS_EACH:
            step(each, context)
            row[each] = statistics.median(step(each, context) for _ in range(args.repeats))
        table[context] = row
        print(f"context {context:4d} x {SEQS} ({SEQS * context:5d} cells): "
              + "  ".join(f"{SEQS}x{each} {row[each] * 1000:6.1f} ms" for each in TOKENS_EACH), flush=True)
    # extra seconds of a step over the empty case = c * rows * cells: least squares through 0
    points = [(SEQS * each * SEQS * context, table[context][each] - table[0][each])
              for context in contexts if context for each in TOKENS_EACH]
    c = sum(x * y for x, y in points) / sum(x * x for x, _ in points) if points else 0.0
    widest = max(contexts)
    full = table[widest][max(TOKENS_EACH)] / table[0][max(TOKENS_EACH)]
    print(f"a step of {SEQS * max(TOKENS_EACH)} rows at {widest} tokens a sequence costs {full:.2f}x the empty one; "
          f"attention: {c * 1e6:.2f} us per row per KV cell in use (least squares over {len(points)} steps)")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
