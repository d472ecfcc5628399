"""The load case, bounded: a real node process (the real model) pointed at a real ARCA takes
rounds of concurrent streams, 30% of them abandoned mid-stream, while ARCA is killed and
restarted, then silenced (SIGSTOP: connections open, no answer) and resumed. At idle the
node must be where it was: every slot free, nothing active or queued, the KV cells used
and reserved back at the idle figure, RSS within RSS_MARGIN_MIB of its level after the
warm-up round, /health's archive back to ok, and a plain request answered.

The load and the idle check are bench/stream_load.py's, which bench/soak.py runs for as
long as it is asked.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from arca.launch import free_port, spawn_arca
from tests.node.api.live import http_json

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench.node_process import node_server  # noqa: E402
from bench.stream_load import IDLE_KEYS, idle_figures, rss_mib, stream_round, wait_idle  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

STREAMS = 12  # per round, against 4 slots
ABANDONED = 0.3
MAX_TOKENS = 8
RSS_MARGIN_MIB = 48  # after the warm-up round; the stated margin of the idle check


def archive_state(url: str) -> str:
    return http_json("GET", url + "/health", timeout=10)[2]["archive"]


async def round_with_fault(url: str, rng: random.Random, number: int, fault) -> tuple:
    """One round of streams, `fault` (a coroutine) running beside it from its start."""
    outcomes, seen = await asyncio.gather(
        stream_round(url, STREAMS, ABANDONED, rng, first_number=number, max_tokens=MAX_TOKENS), fault)
    return outcomes, seen


def test_abandoned_streams_and_archive_faults_leave_the_node_idle(gemma_path, tmp_path):
    started = time.monotonic()
    port = free_port()
    arca_dir = tmp_path / "arca"
    arca = [spawn_arca(arca_dir, port=port)[0]]
    # A shared host may be slow: streams wait for a slot rather than get the queue bound's 503.
    env = {"REAME_ARCA_REMOTE": f"127.0.0.1:{port}", "REAME_SERVER_MAX_QUEUE_WAIT_S": "120"}
    try:
        # One llama.cpp thread, as the fleet tests run theirs: spinning threads on a shared
        # 2-core host cost far more than they bring.
        with node_server(str(gemma_path), "--threads", "1", ctx=2048, parallel=4, env=env) as (url, node, _):
            idle = idle_figures(url)
            phases = {"node up": round(time.monotonic() - started, 1)}
            print(phases, flush=True)
            assert idle["slots_free"] == idle["slots_total"] and idle["active"] == idle["queued"] == 0, idle
            rng = random.Random(23)

            async def nothing() -> list[str]:
                return []

            async def kill_and_restart() -> list[str]:
                await asyncio.sleep(1.0)
                arca[0].send_signal(signal.SIGKILL)
                arca[0].wait(10)
                await asyncio.sleep(1.5)
                arca[0] = (await asyncio.to_thread(spawn_arca, arca_dir, port=port))[0]
                return ["restarted"]

            async def silence() -> list[str]:
                await asyncio.sleep(0.5)
                arca[0].send_signal(signal.SIGSTOP)
                await asyncio.sleep(3.0)
                state = await asyncio.to_thread(archive_state, url)
                arca[0].send_signal(signal.SIGCONT)
                return [state]

            outcomes, _ = asyncio.run(round_with_fault(url, rng, 0, nothing()))  # warm-up, ARCA up
            assert set(outcomes) == {"done", "abandoned"}, outcomes
            figures, _ = wait_idle(url, idle)
            assert {key: figures[key] for key in IDLE_KEYS} == {key: idle[key] for key in IDLE_KEYS}
            rss_after_warmup = rss_mib(node.pid)
            phases["warm-up round"] = round(time.monotonic() - started, 1)
            print(phases, flush=True)

            rounds = {}
            for name, number, fault in (("ARCA killed and restarted", 1000, kill_and_restart),
                                        ("ARCA silent (SIGSTOP)", 2000, silence)):
                outcomes, seen = asyncio.run(round_with_fault(url, rng, number, fault()))
                rounds[name] = (outcomes, seen)
                phases[name] = round(time.monotonic() - started, 1)
                print(phases, outcomes, seen, flush=True)
                assert set(outcomes) == {"done", "abandoned"}, (name, outcomes)
                assert outcomes["abandoned"] == round(STREAMS * ABANDONED), (name, outcomes)
            assert rounds["ARCA silent (SIGSTOP)"][1] == ["degraded"], rounds  # the fault reached the node

            figures, waited = wait_idle(url, idle)
            assert {key: figures[key] for key in IDLE_KEYS} == {key: idle[key] for key in IDLE_KEYS}, \
                (figures, idle, rounds)
            rss = rss_mib(node.pid)
            assert rss <= rss_after_warmup + RSS_MARGIN_MIB, (rss, rss_after_warmup)

            deadline = time.monotonic() + 20
            while archive_state(url) != "ok":
                assert time.monotonic() < deadline, "the node never saw ARCA back"
                time.sleep(0.2)
            status, _, body = http_json("POST", url + "/v1/chat/completions", {
                "model": "gemma3-270m", "messages": [{"role": "user", "content": "Name a river."}],
                "max_tokens": 4, "temperature": 0}, timeout=60)
            assert status == 200 and body["choices"][0]["message"]["content"], body
            print(f"idle again {waited:.2f} s after the last round; RSS {rss_after_warmup:.0f} -> {rss:.0f} MiB; "
                  f"{time.monotonic() - started:.0f} s in all; phases {phases}; {rounds}")
    finally:
        if arca[0].poll() is None:
            arca[0].send_signal(signal.SIGCONT)
            arca[0].terminate()
            arca[0].wait(30)
