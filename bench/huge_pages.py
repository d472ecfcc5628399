"""Steps with the weights in 2 MiB pages against the weights mapped, same host, same run.

    .venv/bin/python bench/huge_pages.py [--rounds 3] [--repeats 15] [--threads N]

Each round runs two child processes one after the other, one per way: the model mapped (4 KiB
page-cache pages, llama.cpp's default) and read into 2 MiB pages (node/engine/huge_pages.py,
the node's default where the kernel offers transparent huge pages). Each child fills one
sequence with 1,000 tokens in chunks of 250 (their ms printed), then times steps of 1, 2, 3, 4,
5, 8, 12 and 16 tokens with logits at that position (medians of --repeats) and prints a
digest of every step's logits. Printed: each way's medians over the rounds, the ratio per
size, and whether the logits are the same bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 8, 12, 16)


def child(model_path: str, huge: bool, repeats: int, threads: int) -> dict:
    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

    began = time.perf_counter()
    model = LlamaModel(Path(model_path), extra_buffers=False, huge_pages=huge)
    load_s = time.perf_counter() - began
    ctx = LlamaContext(model, n_ctx=2048, n_batch=256, n_ubatch=256, n_seq_max=1, n_threads=threads,
                       max_outputs_per_seq=16)
    batch = TokenBatch(256)
    tokens = model.tokenize("The harbour of Vellmar was built in the last years of the old kingdom. " * 80)[:1000]
    chunks = []
    for c in range(4):
        batch.clear()
        batch.add(tokens[c * 250:(c + 1) * 250], c * 250, 0, logits="last")
        t0 = time.perf_counter()
        assert ctx.decode(batch) == 0
        chunks.append(time.perf_counter() - t0)
    digest = hashlib.sha256()
    samples: dict[int, list[float]] = {n: [] for n in SIZES}
    for r in range(repeats):
        for n in SIZES:
            batch.clear()
            batch.add(tokens[:n], 1000, 0, logits="all")
            t0 = time.perf_counter()
            assert ctx.decode(batch) == 0
            samples[n].append(time.perf_counter() - t0)
            if r == 0:
                digest.update(ctx.logits(n).tobytes())
            ctx.seq_rm(0, 1000, -1)
    collapsed = model.collapsed
    ctx.close()
    model.close()
    return {"load_s": load_s, "chunks_ms": [c * 1000 for c in chunks],
            "steps_ms": {str(n): statistics.median(v) * 1000 for n, v in samples.items()},
            "digest": digest.hexdigest()[:16], "huge": collapsed.describe() if collapsed is not None else "mapped"}


def run_child(model: str, huge: bool, repeats: int, threads: int) -> dict:
    command = [sys.executable, __file__, "--child", "huge" if huge else "mapped", "--model", model,
               "--repeats", str(repeats), "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, check=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return orjson.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None)
    parser.add_argument("--child", choices=("mapped", "huge"), default=None)
    args = parser.parse_args()
    model = args.model or str(default_model())
    if args.child:
        sys.stdout.buffer.write(orjson.dumps(child(model, args.child == "huge", args.repeats, args.threads)) + b"\n")
        return 0
    from node.engine import huge_pages

    print_header(Path(model), threads=args.threads)
    if not huge_pages.offered():
        print(f"this kernel offers no transparent huge pages ({huge_pages.thp_mode() or 'none'}): nothing to compare")
        return 0
    results: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(args.rounds):
        for huge in (False, True) if r % 2 == 0 else (True, False):
            results[huge].append(run_child(model, huge, args.repeats, args.threads))
    for huge in (False, True):
        last = results[huge][-1]
        print(f"{'2 MiB pages' if huge else 'mapped':12s} load {statistics.median(x['load_s'] for x in results[huge]):.2f} s "
              f"({last['huge']}); prompt chunks of 250 at 0/250/500/750: "
              + " ".join(f"{statistics.median(x['chunks_ms'][c] for x in results[huge]):.0f}" for c in range(4)) + " ms")
    print(f"{'tokens':>8s} {'mapped':>9s} {'2 MiB':>9s} {'ratio':>7s}")
    for n in SIZES:
        mapped = statistics.median(x["steps_ms"][str(n)] for x in results[False])
        huge = statistics.median(x["steps_ms"][str(n)] for x in results[True])
        print(f"{n:8d} {mapped:7.1f} ms {huge:7.1f} ms {mapped / huge:6.2f}x")
    digests = {x["digest"] for side in results.values() for x in side}
    print(f"logits the same bit for bit: {'yes' if len(digests) == 1 else 'no: ' + ', '.join(sorted(digests))}; "
          f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
