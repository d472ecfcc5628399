"""What one decode step costs by the number of tokens with logits in it (the verify cost curve).

    .venv/bin/python bench/verify_cost.py [--threads 2] [--repeats 5]

One sequence with a 282-token context; steps of 1, 2, 3, 5, 9 and 17 tokens (a next token plus
0..16 draft tokens), every token with logits as verification needs, and the same sizes with
logits on the last token only (the transformer body alone). Prints min and median per size,
the cost line fitted to them (node/engine/cost_line.py: the extra cost per token as a fraction
s of a one-token step), and the ceiling it puts on speculation: (k + 1) / (1 + k * s) for a
fully kept draft of k tokens. It runs once with llama.cpp's extra buffer types (AMX, CPU
repack) off and once on, where the kernel probe says they run on this host (--extra-buffers),
after the header with llama.cpp's system info and the buffer types the weights went to.
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
from node.engine.cost_line import fit_samples  # noqa: E402
from node.engine.kernels import choose_kernels  # noqa: E402
from node.engine.llama import LlamaContext, LlamaModel, TokenBatch, system_info  # noqa: E402

SIZES = (1, 2, 3, 5, 9, 17)


def measure(path: Path, extra_buffers: bool, threads: int, repeats: int) -> None:
    model = LlamaModel(path, extra_buffers=extra_buffers)
    print(f"extra buffers {'on' if extra_buffers else 'off'}: weights in "
          + ", ".join(f"{name} {mib:.1f} MiB" for name, mib in model.buffers.items()))
    ctx = LlamaContext(model, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=threads,
                       max_outputs_per_seq=max(SIZES))
    batch = TokenBatch(512)
    tokens = model.tokenize("The harbour of Vellmar was built " * 40)[:282]
    batch.add(tokens, 0, 0, logits="last")
    if ctx.decode(batch) != 0:
        raise SystemExit("prefill failed")
    start = len(tokens)
    for mode in ("all", "last"):
        seconds: dict[int, list[float]] = {n: [] for n in SIZES}
        for _ in range(repeats):  # rounds over every size: a burst of load touches all alike
            for n in SIZES:
                batch.clear()
                batch.add(tokens[:n], start, 0, logits=mode)
                t0 = time.perf_counter()
                if ctx.decode(batch) != 0:
                    raise SystemExit(f"decode of {n} tokens failed")
                seconds[n].append(time.perf_counter() - t0)
                ctx.seq_rm(0, start, -1)
        print(f"  logits on {mode:4s}: " + "  ".join(f"{n} tok {min(v) * 1000:.1f} ms (med {statistics.median(v) * 1000:.1f})"
                                                 for n, v in seconds.items()))
        if mode == "all":
            line = fit_samples(seconds)
            assert line is not None
            s = line.row_share
            print(f"  cost line: {line.describe()}; ceiling for a fully kept draft: "
                  f"k=4 {5 / (1 + 4 * s):.2f}x, k=8 {9 / (1 + 8 * s):.2f}x, k=16 {17 / (1 + 16 * s):.2f}x")
    ctx.close()
    model.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--extra-buffers", choices=("both", "on", "off"), default="both",
                        help="measure with llama.cpp's extra buffer types, without, or both where both run")
    args = parser.parse_args()
    print_header(threads=args.threads)
    print(f"llama.cpp system info: {system_info()}")
    path = default_model()
    choice = choose_kernels(path, n_threads=args.threads)
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.extra_buffers]
    for extra in modes:
        if extra and choice.usable is False:
            print(f"extra buffers on: not measured, they do not run on this host ({choice.reason})")
            continue
        measure(path, extra, args.threads, args.repeats)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
