"""The llama.cpp thread count, tuned online from measured step times.

On shared vCPUs fewer threads are often faster: every graph node ends at a barrier, and a
thread descheduled by another process on the same cores makes the others wait for it. The
right count changes with the neighbours, so it is measured, not guessed: from time to time
the tuner runs a paired trial of each other candidate against the current count, steps
alternating between the two, and compares decode-only steps of the same size (the same
tokens in the batch) pair by pair, so a change of load during the trial touches both sides
alike. A candidate whose median ratio is under SWITCH_RATIO becomes the count, with a log
line giving the figures; trials come back after a backoff that doubles while the count
holds (a change resets it).

Candidates: the configured count, one fewer, half of it and 1. When the user fixed the
count (`--threads`, `[model] threads`), the tuner is not built.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

FIRST_TRIAL_STEPS = 64     # decode-only steps before the first trial
PAIRS = 8                  # same-size pairs compared per candidate
MAX_TRIAL_STEPS = 64       # a trial that cannot find its pairs gives up
SWITCH_RATIO = 0.93        # candidate's median time over the current one's to switch
BACKOFF_START = 256
BACKOFF_MAX = 16384


@dataclass(slots=True)
class _Trial:
    candidate: int
    steps: int = 0
    last: tuple[int, int, float] | None = None    # (threads, n_tokens, seconds) of the previous step
    ratios: list[float] = field(default_factory=list)


class ThreadTuner:
    """Says how many threads the next step runs with, and hears what each step took."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max(1, max_threads)
        self.current = self.max_threads
        self.candidates = sorted({self.max_threads, self.max_threads - 1, self.max_threads // 2, 1} - {0},
                                 reverse=True)
        self._countdown = FIRST_TRIAL_STEPS
        self._backoff = BACKOFF_START
        self._queue: list[int] = []
        self._trial: _Trial | None = None
        self._changed = False
        self.trials = 0
        self.switches = 0

    def threads(self) -> int:
        """The count for the next decode-only step."""
        trial = self._trial
        if trial is None:
            return self.current
        # alternate: current, candidate, current, ... (a pair is two neighbouring steps)
        return trial.candidate if trial.steps % 2 else self.current

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        """A decode-only step of n_tokens tokens ran with `threads` threads in `seconds`."""
        if len(self.candidates) < 2:
            return
        trial = self._trial
        if trial is None:
            self._countdown -= 1
            if self._countdown <= 0:
                self._queue = [c for c in self.candidates if c != self.current]
                self._changed = False
                self._next_trial()
            return
        trial.steps += 1
        if trial.last is not None and trial.last[1] == n_tokens and trial.last[0] != threads:
            current_s, candidate_s = ((trial.last[2], seconds) if threads == trial.candidate
                                      else (seconds, trial.last[2]))
            if current_s > 0:
                trial.ratios.append(candidate_s / current_s)
            trial.last = None
        else:
            trial.last = (threads, n_tokens, seconds)
        if len(trial.ratios) >= PAIRS or trial.steps >= MAX_TRIAL_STEPS:
            self._judge(trial)
            self._next_trial()

    def _judge(self, trial: _Trial) -> None:
        self.trials += 1
        if len(trial.ratios) < PAIRS // 2:
            return
        ratio = statistics.median(trial.ratios)
        if ratio < SWITCH_RATIO:
            log.info("llama.cpp threads %d -> %d: steps of the same size took %.2fx the time with %d "
                     "(median of %d pairs)", self.current, trial.candidate, ratio, trial.candidate,
                     len(trial.ratios))
            self.current = trial.candidate
            self.switches += 1
            self._changed = True

    def _next_trial(self) -> None:
        while self._queue:
            candidate = self._queue.pop(0)
            if candidate != self.current:
                self._trial = _Trial(candidate)
                return
        self._trial = None
        self._backoff = BACKOFF_START if self._changed else min(BACKOFF_MAX, self._backoff * 2)
        self._countdown = self._backoff

    def state(self) -> dict[str, object]:
        return {"threads": self.current, "candidates": self.candidates, "trials": self.trials,
                "switches": self.switches,
                "trying": self._trial.candidate if self._trial is not None else None}
