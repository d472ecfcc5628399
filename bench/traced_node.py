"""`python -m bench.traced_node run MODEL --serve ...`: the `reame` command with every decode call
of its engine written down, for bench/workload_trace.py.

Each line of $REAME_TRACE (JSON): a decode call (`"step"`: its seconds and, per sequence in the
batch, its key, whether it decodes, its tokens in the batch, the draft tokens among them and the
tokens it had generated before and after), or a sequence's end (`"end"`: its key, prompt and
generated tokens). The wrap times the decode call alone, sampling and bookkeeping included, from
outside the scheduler, which keeps no per-step log of its own.
"""

from __future__ import annotations

import json
import os
import sys
import time

from node.cli.main import main
from node.engine import scheduler

_OUT = open(os.environ["REAME_TRACE"], "w", buffering=1)
_decode = scheduler.Scheduler._decode
_end = scheduler.Scheduler._end


def _traced_decode(self, entries) -> None:
    seqs = [(e, e.seq, len(e.seq.generated)) for e in entries]
    start = time.perf_counter()
    _decode(self, entries)
    seconds = time.perf_counter() - start
    _OUT.write(json.dumps({"step": seconds, "seqs": [
        {"key": seq.key, "decoding": e.decoding, "tokens": len(e.tokens),
         "drafted": len(e.tokens) - e.known - 1 if e.decoding else 0, "before": before, "after": len(seq.generated)}
        for e, seq, before in seqs]}) + "\n")


def _traced_end(self, seq, reason, error=None) -> None:
    done = seq.phase is scheduler.Phase.DONE
    _end(self, seq, reason, error)
    if not done:
        _OUT.write(json.dumps({"end": seq.key, "prompt": list(seq.prompt), "generated": list(seq.generated)}) + "\n")


scheduler.Scheduler._decode = _traced_decode  # type: ignore[method-assign]
scheduler.Scheduler._end = _traced_end  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
