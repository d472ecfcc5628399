"""The kernel probe's child process: load the model each way asked, decode batches with logits
on every row, and print what each step cost.

    python -m node.engine.kernel_probe MODEL --modes off,on [--threads N] [--repeats R] [--huge-pages]

For each mode in order it loads the model with llama.cpp's extra buffer types on or off
(with --huge-pages its weights read into 2 MiB pages, as a node does where the kernel offers them),
runs a warm-up of every step shape (the first multi-row step pays for its buffers), then
`repeats` rounds of steps of 1 row (one sequence), 3 rows (one sequence, as a verified
draft) and 8 rows (four sequences of two), and prints one JSON line:

    {"mode": "on", "buffers": {"CPU_REPACK": 50.1, ...}, "load_s": 0.4,
     "samples": {"1": [s, ...], "3": [...], "8": [...]}}

A kernel the CPU traps kills this process by a signal; the parent (node/engine/kernels.py)
reads what was printed before and how the process ended. The parent runs the modes that
may trap last, so the lines printed before still count.

Test hook (documented in docs/CONFIG.md): with REAME_KERNEL_PROBE_FAULT set to a signal
name (e.g. SIGILL), the child kills itself by that signal just before its first batched
decode with extra buffers on, as a trapping AMX kernel does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import orjson

FAULT_ENV = "REAME_KERNEL_PROBE_FAULT"
SHAPES = ((1, 1), (1, 3), (4, 2))  # (sequences, rows each): steps of 1, 3 and 8 rows


def _inject_fault() -> None:
    name = os.environ.get(FAULT_ENV, "").strip().upper()
    if name:
        os.kill(os.getpid(), getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


def probe(path: Path, extra_buffers: bool, n_threads: int, repeats: int, huge_pages: bool = False) -> dict:
    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

    t0 = time.perf_counter()
    model = LlamaModel(path, extra_buffers=extra_buffers, huge_pages=huge_pages)
    load_s = time.perf_counter() - t0
    ctx = LlamaContext(model, n_ctx=256, n_batch=16, n_ubatch=16, n_seq_max=4, n_threads=n_threads,
                       max_outputs_per_seq=3)
    batch = TokenBatch(16)
    filler = model.info.bos if model.info.bos is not None else 1

    def step(n_seqs: int, rows: int) -> float:
        batch.clear()
        for seq in range(n_seqs):
            batch.add([filler] * rows, 0, seq, logits="all")
        start = time.perf_counter()
        rc = ctx.decode(batch)
        elapsed = time.perf_counter() - start
        for seq in range(n_seqs):
            ctx.seq_rm(seq)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return elapsed

    if extra_buffers:
        _inject_fault()
    for n_seqs, rows in SHAPES:  # warm-up: nothing measured
        step(n_seqs, rows)
    samples: dict[str, list[float]] = {str(n * r): [] for n, r in SHAPES}
    for _ in range(repeats):  # rounds over every shape: a burst of load touches all of them alike
        for n_seqs, rows in SHAPES:
            samples[str(n_seqs * rows)].append(step(n_seqs, rows))
    result = {"mode": "on" if extra_buffers else "off", "buffers": model.buffers, "load_s": load_s,
              "samples": samples}
    if model.huge_mib is not None:
        result["huge_mib"] = model.huge_mib
    ctx.close()
    model.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.engine.kernel_probe")
    parser.add_argument("model", type=Path)
    parser.add_argument("--modes", default="off,on", help="comma-separated: on, off (in this order)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--huge-pages", action="store_true", help="the weights read into 2 MiB pages, as a node does")
    args = parser.parse_args(argv)
    for mode in args.modes.split(","):
        if mode not in ("on", "off"):
            parser.error(f"unknown mode {mode!r}")
        try:
            line = probe(args.model, mode == "on", args.threads, max(1, args.repeats), args.huge_pages)
        except Exception as exc:  # the parent reads it as this mode's failure
            line = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
