"""`reame batch INPUT MODEL`: the real Gemma model loaded in the command's own process.

Lines are answered by the node's parser and service without a socket; the output holds one
record per line in input order, and a rerun answers nothing again (the model is not even
asked: every custom_id is already there). 128-token context per slot, 4 tokens an answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def test_lines_on_a_model_loaded_in_process(gemma_path, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"custom_id": f"m{i}", "method": "POST", "url": url, "body": body} for i, (url, body) in enumerate([
        ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4,
                                  "temperature": 0}),
        ("/v1/completions", {"prompt": "One, two,", "max_tokens": 4, "temperature": 0}),
    ])]
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REAME_HOME": str(tmp_path / "home"),
           "REAME_MODEL_CONTEXT_LENGTH": "256", "REAME_SPECULATIVE_ENABLED": "false"}
    command = [sys.executable, "-m", "node.cli", "batch", str(source), str(gemma_path), "-o", str(out),
               "--parallel", "2"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 lines (3 ok, 0 failed, 0 already done)" in done.stdout
    records = [orjson.loads(raw) for raw in out.read_bytes().splitlines()]
    assert [r["custom_id"] for r in records] == ["m0", "m1", "m2"]
    assert [r["response"]["body"]["object"] for r in records] == ["text_completion", "chat.completion",
                                                                  "text_completion"]
    assert all(r["response"]["status_code"] == 200 and r["response"]["body"]["usage"]["completion_tokens"] > 0
               for r in records)
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 lines (0 ok, 0 failed, 3 already done)" in again.stdout
