"""Where bench/versus_llama_server.py's workload spends a node's steps, against what its text allows.

    .venv/bin/python bench/workload_trace.py [--tokens 48] [--clients 4] [--keep FILE]

A node with its defaults (as the comparison runs it: prefix cache, speculation, embedded
archive, a fresh home) serves the workload's two passes from `--clients` clients, each sending
its next request when it has its answer; the node runs under bench/traced_node.py, which writes
down every decode call. Printed: the decode calls (those carrying prompt tokens and the
decode-only ones, with their seconds), the draft tokens verified and kept, the prompt tokens
computed against what the longest prefix each prompt shares with an earlier one leaves, and
the steps each answer decoded in against the fewest a source drafting from text seen could
take (bench/text_oracle.py: its prompt, its own answer so far, and every answer the node
finished before it began, which the Palimpsest holds). Answers replayed whole from L1 take no
step and are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.host import print_header  # noqa: E402
from bench.node_process import node_server  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.text_oracle import SOURCES_MIN_MATCH, oracle_steps  # noqa: E402
from bench.versus_llama_server import run_pass, workload  # noqa: E402


def summarize(events: list[dict]) -> list[str]:
    steps = [e for e in events if "step" in e]
    ends = {e["end"]: (i, e) for i, e in enumerate(events) if "end" in e}
    begun: dict[int, int] = {}
    taken: collections.Counter[int] = collections.Counter()
    for i, e in enumerate(events):
        for s in e.get("seqs", ()):
            if s["decoding"]:
                begun.setdefault(s["key"], i)
                taken[s["key"]] += 1
    prompt_steps: list[dict] = []
    decode_only: list[dict] = []
    for e in steps:
        (decode_only if all(s["decoding"] for s in e["seqs"]) else prompt_steps).append(e)
    drafted = sum(s["drafted"] for e in steps for s in e["seqs"])
    kept = sum(max(0, s["after"] - s["before"] - 1) for e in steps for s in e["seqs"] if s["drafted"])
    lines = [f"decode calls {len(steps)}, {sum(e['step'] for e in steps):.2f} s: {len(prompt_steps)} with prompt "
             f"tokens ({sum(s['tokens'] for e in prompt_steps for s in e['seqs'] if not s['decoding'])} of them, "
             f"{sum(e['step'] for e in prompt_steps):.2f} s), {len(decode_only)} decode-only "
             f"({sum(e['step'] for e in decode_only):.2f} s)",
             f"draft tokens verified {drafted}, kept {kept}"]
    run_total = oracle_total = paired_total = 0
    rows = []
    for key, start in sorted(begun.items(), key=lambda item: item[1]):
        if key not in ends:
            continue
        learned = [e["prompt"] + e["generated"] for i, e in ends.values() if i < start]
        _, end = ends[key]
        oracle = oracle_steps(end["prompt"], end["generated"], learned)
        paired = oracle_steps(end["prompt"], end["generated"], learned, min_match=SOURCES_MIN_MATCH)
        run_total += taken[key]
        oracle_total += oracle
        paired_total += paired
        rows.append(f"  answer {len(rows) + 1:2d}: {taken[key]:3d} steps, the text's fewest {oracle:3d}, "
                    f"from {SOURCES_MIN_MATCH}+ matched tokens {paired:3d}")
    lines.append(prompt_tokens(events, ends))
    lines.append(f"sequence-steps {run_total}; the fewest the text allows {oracle_total} "
                 f"({run_total / max(1, oracle_total):.2f}x as many); drafting only from occurrences matching "
                 f"{SOURCES_MIN_MATCH}+ tokens, as the node's sources need, {paired_total} ({run_total / max(1, paired_total):.2f}x)")
    return lines + rows


def prompt_tokens(events: list[dict], ends: dict[int, tuple[int, dict]]) -> str:
    """The prompt tokens the node computed (its prefill entries) against what the longest prefix
    each prompt shares with one that came before leaves (its last token is always computed,
    for its logits)."""
    from node.engine.budget import common_prefix

    first_seen: dict[int, int] = {}
    computed: collections.Counter[int] = collections.Counter()
    for i, e in enumerate(events):
        for s in e.get("seqs", ()):
            first_seen.setdefault(s["key"], i)
            if not s["decoding"]:
                computed[s["key"]] += s["tokens"]
    earlier: list[list[int]] = []
    needed = 0
    for key in sorted(ends, key=lambda k: first_seen.get(k, ends[k][0])):
        prompt = ends[key][1]["prompt"]
        shared = max((common_prefix(prompt, other) for other in earlier), default=0)
        needed += len(prompt) - min(shared, len(prompt) - 1)
        earlier.append(prompt)
    return (f"prompt tokens computed {sum(computed[key] for key in ends)}; the longest prefix each prompt "
            f"shares with an earlier one leaves {needed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument("--keep", type=Path, default=None, help="write the decode calls' trace (JSON lines) here too")
    args = parser.parse_args()
    print_header(args.model, threads=None)
    from node.engine.kernels import choose_kernels

    model = args.model or str(default_model())
    extra_buffers = choose_kernels(Path(model)).extra_buffers
    with tempfile.TemporaryDirectory(prefix="reame-trace-") as scratch:
        trace = Path(scratch) / "steps.jsonl"
        env = {"REAME_CACHE_ENABLED": "true", "REAME_MODEL_EXTRA_BUFFERS": "on" if extra_buffers else "off",
               "REAME_TRACE": str(trace)}
        with node_server(model, ctx=8192, parallel=4, env=env, module="bench.traced_node") as (url, _, _):
            first = asyncio.run(run_pass(url, workload(False), args.tokens, args.clients))
            second = asyncio.run(run_pass(url, workload(True), args.tokens, args.clients))
        written = trace.read_text()
        if args.keep is not None:
            args.keep.write_text(written)
    events = [json.loads(line) for line in written.splitlines() if line]
    print(f"two passes: {first.seconds:.2f} s + {second.seconds:.2f} s = {first.seconds + second.seconds:.2f} s, "
          f"load {os.getloadavg()[0]:.1f}")
    for line in summarize(events):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
