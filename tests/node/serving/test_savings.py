"""The savings figures (node/serving/savings.py) from counters a test sets, on a clock it moves:
what is computed, what each tier saved, the effective rate against plain, the trend, and the
log line written while the node is busy."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.serving.ledger import Ledger
from node.serving.savings import Savings, SavingsConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup():
    clock = Clock()
    ledger = Ledger(clock=clock)
    engine = {"prefill_tokens": 0, "generated_tokens": 0, "draft_accepted": 0, "prefix_tokens_restored": 0}
    drafts = {"lookup": 0, "archive": 0}
    savings = Savings(ledger, lambda: dict(engine), drafts=lambda: dict(drafts), plain_rate=lambda: 50.0,
                      config=SavingsConfig(window_minutes=1, sample_seconds=10, log_minutes=1), clock=clock)
    return clock, ledger, engine, drafts, savings


def serve(clock, ledger, engine, drafts):
    """Two seconds busy: one answer computed (100 prompt tokens, 64 of them restored; 40 generated,
    10 of them accepted drafts), one replayed from L1 (50 + 10 tokens)."""
    ledger.enter()
    clock.now += 2
    ledger.served(100, 40, from_l1=False)
    ledger.served(50, 10, from_l1=True)
    ledger.leave()
    engine.update(prefill_tokens=36, generated_tokens=40, draft_accepted=10, prefix_tokens_restored=64)
    drafts.update(lookup=4, archive=6)


def test_a_period_adds_up(setup):
    clock, ledger, engine, drafts, savings = setup
    serve(clock, ledger, engine, drafts)
    clock.now += 8
    report = savings.report()
    total = report["since_start"]
    assert total["tokens_served"] == 200 and total["answers"] == 2
    assert total["tokens_computed"] == 36 + 40 - 10
    saved = total["saved"]
    assert saved["l1"] == {"tokens": 60, "share": 0.3, "answers": 1}
    assert saved["prefix"] == {"tokens": 64, "share": 0.32}
    assert saved["drafts"] == {"tokens": 10, "share": 0.05, "by_source": {"lookup": 4, "archive": 6}}
    assert total["tokens_computed"] + 60 + 64 + 10 == total["tokens_served"]  # every served token accounted for
    assert total["busy_seconds"] == 2.0 and total["seconds"] == 10.0
    assert total["effective_tokens_per_second"] == 25.0 and total["plain_tokens_per_second"] == 50.0
    assert total["speedup"] == 0.5
    assert report["trend"][-1]["served_per_second"] == 20.0


def test_the_window_leaves_out_what_is_older(setup):
    clock, ledger, engine, drafts, savings = setup
    serve(clock, ledger, engine, drafts)
    for _ in range(8):  # 80 seconds of samples, nothing served: past the one-minute window
        clock.now += 10
        savings.sample()
    report = savings.report()
    assert report["since_start"]["tokens_served"] == 200 and report["window"]["tokens_served"] == 0
    assert all(point["t"] >= clock.now - 60 for point in report["trend"])


async def test_the_log_line_while_busy_and_silence_when_idle(setup, caplog, monkeypatch):
    clock, ledger, engine, drafts, savings = setup
    steps = []

    async def sleep(seconds):
        steps.append(seconds)
        clock.now += seconds
        if len(steps) == 6:
            serve(clock, ledger, engine, drafts)  # busy in the first minute only
        if len(steps) > 14:
            raise asyncio.CancelledError

    monkeypatch.setattr("node.serving.savings.asyncio.sleep", sleep)
    with caplog.at_level(logging.INFO, logger="node.serving.savings"), pytest.raises(asyncio.CancelledError):
        await savings.run()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["served 200 tokens, computed 66 (L1 30%, prefix 32%, drafts 5%), effective 25.0 tok/s "
                     "= 0.50 x plain (50.0 tok/s)"]
