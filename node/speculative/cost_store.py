"""The calibrated verify cost curve kept between starts, one file per host, model and shape.

The planner prices every step on the cost curve (costs.py). Until the curve is calibrated it
prices them on a default line without the host's staircase, and a node under load from its
first second is never idle to calibrate: on the AMX-trapping Xeon of docs/BENCHMARKS.md a
whole 4-client run planned 5-row and 9-row steps, the costliest sizes there, believing them
cheap. So a node measures the curve before it serves (node/assembly.py) and keeps the
medians it measured here (the sizes', the steps of 1 to n sequences with one token each,
`spread`, and what a row costs more after so many tokens of context, `context`): the next start with the same model file, llama.cpp build, CPU,
threads, kernels, slots and draft length plans on them from its first step, and measures
again in the background (the engine's first calibration gives way to requests).

A file that cannot be read (damaged, another layout) is ignored and rewritten at the next
calibration; a home that cannot be written leaves the node measuring at every start.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

LAYOUT = 1


class CostStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[dict[int, float], dict[int, float], dict[int, float]] | None:
        """The step sizes' measured seconds, those of k sequences' one token each, and a row's
        extra seconds by context (each empty in a file kept before it was measured), or None (no
        file, or one that cannot be used)."""
        try:
            data = orjson.loads(self.path.read_bytes())
            if data.get("layout") != LAYOUT:
                return None
            points = {int(n): float(s) for n, s in data["points"].items()}
            spread = {int(n): float(s) for n, s in data.get("spread", {}).items()}
            context = {int(n): float(s) for n, s in data.get("context", {}).items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("verify cost curve: ignoring unreadable %s (%s)", self.path, exc)
            return None
        if not points or any(n < 1 or not 0 < s < 60 for n, s in (*points.items(), *spread.items())) \
                or any(n < 1 or not 0 <= s < 60 for n, s in context.items()):
            log.warning("verify cost curve: ignoring %s (sizes or times out of range)", self.path)
            return None
        return points, spread, context

    def save(self, points: dict[int, float], spread: dict[int, float] | None = None,
             context: dict[int, float] | None = None) -> None:
        record = {"layout": LAYOUT, "points": {str(n): s for n, s in sorted(points.items())},
                  "spread": {str(n): s for n, s in sorted((spread or {}).items())},
                  "context": {str(n): s for n, s in sorted((context or {}).items())}, "measured_at": time.time()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temp = self.path.with_suffix(f".tmp{os.getpid()}")
            temp.write_bytes(orjson.dumps(record))
            os.replace(temp, self.path)
        except OSError as exc:
            log.warning("verify cost curve: could not keep it in %s (%s)", self.path.parent, exc)
