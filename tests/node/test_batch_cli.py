"""`reame batch` under a pseudo-terminal against a node process on the fake engine
(tests/node/batches/fake_node.py; tests/node/fake_engine.py at 10 ms a token).

The progress bar is drawn (lines, tok/s, ETA, savings); a rerun skips the custom_ids the
output already answers (the node's log of started prompts shows only the new ones);
Ctrl-C during a Batch API run cancels the batch and leaves whole lines in input order,
which a rerun completes.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from tests.conftest import free_port
from tests.node.api.live import http_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    log = home / "submitted.log"
    process = subprocess.Popen([sys.executable, "-m", "tests.node.batches.fake_node", str(home), str(port), str(log)],
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    yield f"http://127.0.0.1:{port}", log
    process.terminate()
    process.wait(10)


class Terminal:
    """`reame batch ...` with a pty as its terminal; the text it drew, its exit code."""

    def __init__(self, *args: str) -> None:
        master, slave = pty.openpty()
        # Ctrl-C interrupts it as in a terminal, even where the suite runs with SIGINT ignored
        # (a job a non-interactive shell starts in the background inherits that, and so would this)
        self.process = subprocess.Popen([sys.executable, "-m", "node.cli", "batch", *args], cwd=ROOT,
                                        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"},
                                        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.chunks.append(chunk)

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        code = self.process.wait(timeout)
        self.reader.join(10)
        os.close(self.master)
        return code, b"".join(self.chunks).decode("utf-8", "replace")


def write_input(path: Path, ids: range, max_tokens: int = 30) -> list[str]:
    lines = [{"custom_id": f"q{i:03d}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": f"cli line {i}", "max_tokens": max_tokens, "temperature": 0}} for i in ids]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return [line["custom_id"] for line in lines]


def output_ids(path: Path) -> list[str]:
    records = [orjson.loads(raw) for raw in path.read_bytes().splitlines()]
    assert all(record["response"]["status_code"] == 200 for record in records)
    return [record["custom_id"] for record in records]


def started(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def running_with(url: str, completed: int) -> bool:
    """The node's newest batch is in progress with at least `completed` lines done."""
    status, _, listing = http_json("GET", f"{url}/v1/batches?limit=1")
    batch = listing["data"][0] if status == 200 and listing["data"] else None
    return batch is not None and batch["status"] == "in_progress" and batch["request_counts"]["completed"] >= completed


@pytest.mark.slow  # a node process and its batch runs: seconds each
def test_progress_then_a_rerun_runs_only_the_new_lines(node, tmp_path):
    url, log = node
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, range(12))
    code, screen = Terminal(str(source), "-o", str(out), "--server", url, "--via", "requests",
                            "--concurrency", "2").wait()
    assert code == 0, screen
    assert "lines" in screen and "tok/s" in screen and "ETA" in screen and "saved: L1" in screen
    assert "12 lines (12 ok, 0 failed, 0 already done)" in screen
    before = len(started(log))
    ids = write_input(source, range(16))
    code, screen = Terminal(str(source), "-o", str(out), "--server", url).wait()  # the Batch API this time
    assert code == 0 and "4 lines (4 ok, 0 failed, 12 already done)" in screen, screen
    assert sorted(started(log)[before:]) == [f"cli line {i}" for i in range(12, 16)]
    assert output_ids(out) == ids


@pytest.mark.slow  # a node process and its batch runs: seconds each
def test_ctrl_c_cancels_the_batch_and_leaves_whole_lines_a_rerun_completes(node, tmp_path):
    url, _ = node
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_input(source, range(100, 160), max_tokens=30)
    terminal = Terminal(str(source), "-o", str(out), "--server", url)
    deadline = time.monotonic() + 60
    while not running_with(url, completed=3):
        assert time.monotonic() < deadline and terminal.process.poll() is None
        time.sleep(0.05)
    terminal.process.send_signal(signal.SIGINT)
    code, screen = terminal.wait()
    assert code == 130, screen
    kept = output_ids(out)  # every line whole, in input order
    assert len(kept) < len(ids) and kept == [i for i in ids if i in kept]
    code, screen = Terminal(str(source), "-o", str(out), "--server", url, "--via", "requests").wait()
    assert code == 0 and f"({len(ids) - len(kept)} ok, 0 failed, {len(kept)} already done)" in screen, screen
    assert output_ids(out) == ids


@pytest.mark.slow  # reads what the batch runs above served
def test_reame_stats_prints_what_the_node_saved(node):
    url, _ = node
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    table = subprocess.run([sys.executable, "-m", "node.cli", "stats", "--server", url], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    for label in ("tokens served", "tokens computed", "L1 answers", "prefix KV restored", "drafts accepted",
                  "effective tok/s", "served/s trend"):
        assert label in table.stdout
    raw = subprocess.run([sys.executable, "-m", "node.cli", "stats", "--server", url, "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    report = orjson.loads(raw.stdout)
    assert report["since_start"]["tokens_served"] > 0  # the batches of the tests above
