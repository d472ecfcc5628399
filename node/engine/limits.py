"""The scheduler's bounds, fixed at start-up from EngineConfig (node/engine/engine.py): what the
scheduler (scheduler.py) and its helpers (admission.py, drafting.py, prefix_state.py) read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    n_parallel: int
    max_queue: int
    step_token_budget: int
    max_draft: int = 0
    interactive_slots: int = 0  # slots batch-priority requests leave free
    group_slots: int = 0  # most slots the sequences of one request (one group) hold at once; 0: no bound
    resident: bool = True  # a free slot keeps its KV for the next prompt sharing its prefix
    shared_rows: bool = True  # identical siblings draw from one row of logits (riders.py)
    # a prompt sharing this many leading tokens with one being prefilled waits for it to compute
    # them (admission.py `prefix_wait`); 0: never
    prefix_wait_tokens: int = 64
    # a prompt sharing this many leading tokens with an active sequence's KV starts from a copy of
    # those cells, and waits for one prefilling them (admission.py `prefix_copy`); 0: never.
    # Only with `resident` (slots lend their KV to other prompts at all)
    prefix_copy_tokens: int = 32
