"""A node that answers and is stopped at once has still shared what it computed.

A real `reame run --serve` node on a real `reame arca` answers one chat about a ~2,400-token
document (one token, so the answer leaves right after the prefill) and gets SIGTERM the
moment the answer arrives. Once it has exited (cleanly), ARCA holds the answer (L1), the
generation in the corpus (L4) and every prefix state the node stored (L3: the checkpoints at
1,024 and 2,048 tokens and the prompt's last boundary, each in 1 MiB parts), and the node's
log says how long the flush took. A second node then restores the document from ARCA
instead of prefilling it.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.fleet_processes import FleetProcesses
from tests.e2e.test_fleet import wait_for

pytestmark = [pytest.mark.model, pytest.mark.slow]
SUBJECTS = ("The northern depot", "The river crossing", "The eastern mill", "The harbour office", "The hill farm")


def document(lines: int = 125) -> str:
    """About 19 tokens a line."""
    return "Operations diary of the regional office.\n" + "\n".join(
        f"Week {i // 6 + 1}, day {i % 6 + 1}: {SUBJECTS[i % 5]} moved {i * 7 % 97 + 3} crates of item {i}."
        for i in range(lines)) + "\n\n"


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": document()}, {"role": "user", "content": question}]


def arca_counts(fleet: FleetProcesses) -> tuple[int, int, int]:
    """(L1 answers, L4 corpus streams, L3 blobs) held by the fleet's ARCA."""
    info = fleet.redis().info("arca")
    return fleet.redis().dbsize(), int(info["corpus_streams"]), int(info["kv_blocks"])


@pytest.mark.timeout(900)  # two ~2,400-token prefills: ~15 s on a quiet machine, minutes on a loaded one
def test_sigterm_right_after_an_answer_still_shares_l1_l4_and_l3(tmp_path, gemma_path):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    with FleetProcesses(tmp_path, gemma_path, ctx=4096, parallel=1, threads=2) as fleet:
        fleet.start_arca()
        node_a = fleet.start_node("a")
        assert arca_counts(fleet) == (0, 0, 0)
        headers, body = fleet.chat(node_a, messages("Which subject moved the most crates?"), max_tokens=1)
        fleet.node_processes["a"].send_signal(signal.SIGTERM)  # at once: nothing waited for
        prompt_tokens = body["usage"]["prompt_tokens"]
        assert prompt_tokens > 2048 + 64, prompt_tokens  # two checkpoints and the prompt's tail
        assert fleet.node_processes["a"].wait(60) == 0
        answers, streams, blobs = arca_counts(fleet)
        log = (tmp_path / "node-a.log").read_text()
        assert "shutdown: flushed" in log or "shutdown: no archive writes pending" in log, log[-3000:]
        assert answers >= 1 and streams >= 1, (answers, streams, log[-3000:])
        # 1,024, 2,048 and ~2,400 tokens at ~6.3 KiB a token (f16 KV; measured 13 parts for
        # 2,048 tokens) in parts of 1 MiB: 7 + 13 + 15 parts; without the last state, 20
        assert blobs >= 33, (blobs, log[-3000:])

        node_b = fleet.start_node("b")
        started = time.perf_counter()
        _, answer = fleet.chat(node_b, messages("Which week was the busiest?"), max_tokens=2)
        restored = answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert restored >= 2048, (restored, time.perf_counter() - started)
        wait_for(lambda: fleet.metric(node_b, "reame_prefix_cache_hits_total", tier="fleet") >= 1, 10,
                 "node B's L3 hit")
