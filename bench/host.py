"""The header every benchmark prints before its figures: what host and which kernels they were
measured on, and the step cost line measured now.

    # host: Linux 6.18.44 x86_64, 2 cores, load 0.31 0.52 0.60, llama-cpp-python 0.3.36
    # kernels: x86_64 AVX2 AVX512 ... AMX_INT8; extra buffers off (...); weights in CPU_Mapped 235 MiB
    # cost line (measured now): 18.0 ms + 3.50 ms per token with logits (a row is 0.19 of a one-token step)

The kernels come from the node's own decision (node/engine/kernels.py: the cached probe
verdict, or the probe itself), so a bench runs the kernels a node on this host runs; the cost
line is a fresh probe of that way (a second or two), never a cached figure. ARCA benches,
which run no model, print the host line alone (`host_line`).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def host_line() -> str:
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    uname = platform.uname()
    try:
        import llama_cpp

        llama = f", llama-cpp-python {llama_cpp.__version__}"
    except ImportError:
        llama = ""
    return f"# host: {uname.system} {uname.release} {uname.machine}, {os.cpu_count()} cores, load {load}{llama}"


def kernel_header(model: Path | None = None, *, threads: int | None = None, setting: str = "auto") -> str:
    """The three header lines for benches that run the model (`model`: default the offline one)."""
    from bench.offline_model import default_model
    from node.engine import huge_pages
    from node.engine.kernels import choose_kernels, describe, probe_kernels
    from node.engine.llama import cpu_variant, system_info

    path = model or default_model()
    n_threads = threads or os.cpu_count() or 1
    choice = choose_kernels(path, setting=setting, n_threads=n_threads)
    fresh = probe_kernels(path, n_threads=n_threads, modes="on" if choice.extra_buffers else "off",
                          huge_pages=huge_pages.wanted("auto", huge_pages.file_size(path)))
    report = choice.report(system_info(), fresh.buffers or choice.buffers, cpu_variant(), fresh.huge_mib)
    line = fresh.line.as_dict() if fresh.line is not None else None
    kernels = describe({**report, "probe_line_ms": None})
    cost = (f"{line['per_step']:.1f} ms + {line['per_token']:.2f} ms per token with logits "
            f"(a row is {line['row_share']:.2f} of a one-token step)" if line else f"not measured ({fresh.reason})")
    return f"{host_line()}\n# kernels: {kernels}\n# cost line (measured now): {cost}"


def print_header(model: Path | None = None, *, threads: int | None = None, setting: str = "auto") -> None:
    print(kernel_header(model, threads=threads, setting=setting), flush=True)
