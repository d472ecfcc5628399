"""A node SIGKILLed mid-batch and started again finishes the batch, every line exactly once.

The node is a real process (tests/node/batches/fake_node.py) on the fake engine
(tests/node/fake_engine.py, 10 ms a token), talked to with the official `openai` client.
After the kill the store on disk says which lines were finished; the restarted process must
start none of them again, and the output holds every custom_id once, in input order.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import openai
import orjson

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]
LINES = 16


def start(home: Path, port: int, log: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "tests.node.batches.fake_node", str(home), str(port), str(log)],
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def prompt(i: int) -> str:
    return f"line {i:02d} of the restart test"


@pytest.mark.slow  # a node process killed and restarted
def test_a_killed_node_resumes_its_batch_and_never_reruns_a_finished_line(tmp_path):
    port = free_port()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    lines = [{"custom_id": f"id-{i:02d}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "fake", "prompt": prompt(i), "max_tokens": 30, "temperature": 0}}
             for i in range(LINES)]
    first = start(tmp_path, port, tmp_path / "first.log")
    try:
        uploaded = client.files.create(file=("in.jsonl", b"\n".join(orjson.dumps(line) for line in lines)),
                                       purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 30
        while client.batches.retrieve(batch.id).request_counts.completed < 4:
            assert time.monotonic() < deadline, "the batch made no progress"
            time.sleep(0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    with sqlite3.connect(tmp_path / "batches" / "batches.db") as db:
        finished = {row[0] for row in db.execute("SELECT custom_id FROM lines WHERE batch_id = ? AND done = 1",
                                                 (batch.id,))}
    assert 4 <= len(finished) < LINES, "kill the node while the batch runs"
    second = start(tmp_path, port, tmp_path / "second.log")
    try:
        deadline = time.monotonic() + 60
        while (done := client.batches.retrieve(batch.id)).status != "completed":
            assert time.monotonic() < deadline and done.status in ("in_progress", "finalizing"), done.status
            time.sleep(0.05)
        output = [orjson.loads(line) for line in client.files.content(done.output_file_id).content.splitlines()]
    finally:
        second.terminate()
        second.wait(10)
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    assert [record["custom_id"] for record in output] == [line["custom_id"] for line in lines]
    rerun = set((tmp_path / "second.log").read_text().splitlines())
    assert rerun and not rerun & {prompt(int(cid[3:])) for cid in finished}
    # every other line ran on the second node, or had run on the first without being marked done
    # before the kill: its answer was committed to L1 by then, and the second node replays it
    started_first = set((tmp_path / "first.log").read_text().splitlines())
    answered = rerun | {prompt(int(cid[3:])) for cid in finished}
    assert answered | started_first >= {prompt(i) for i in range(LINES)}, sorted(
        {prompt(i) for i in range(LINES)} - answered - started_first)
