"""A batch line whose schema the grammar engine cannot take fails the batch, never the node.

A JSON Schema chaining a thousand `$ref`s overflowed llguidance's stack while the batch
validated (SIGSEGV: the node gone, the batch left `validating`, and every restart died again
on it). The node is a real process (tests/node/batches/fake_node.py, the fake engine: the
check needs no model); the batch is sent with the official `openai` client, and a second
case stores the batch directly, `validating`, before the node first starts.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import openai
import orjson

from node.batches.store import BatchStore
from tests.conftest import free_port
from tests.node.batches.test_restart import start


def chain(links: int) -> dict:
    """An object whose property refers to the next definition, `links` times (75 KB at 1,000)."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lines() -> bytes:
    good = {"custom_id": "good", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    bad = {"custom_id": "poisoned", "method": "POST", "url": "/v1/chat/completions",
           "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": chain(1000)}}}}
    return b"\n".join(orjson.dumps(line) for line in (good, bad))


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return response.status == 200


def wait_done(client: openai.OpenAI, batch_id: str, process) -> object:
    deadline = time.monotonic() + 30
    while (batch := client.batches.retrieve(batch_id)).status == "validating":
        assert process.poll() is None, f"the node died (exit {process.returncode})"
        assert time.monotonic() < deadline, "the batch never left validating"
        time.sleep(0.05)
    return batch


def test_a_poisoned_line_fails_its_batch_and_the_node_lives(tmp_path):
    port = free_port()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    node = start(tmp_path, port, tmp_path / "submits.log")
    try:
        uploaded = client.files.create(file=("in.jsonl", lines()), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = wait_done(client, batch.id, node)
        assert node.poll() is None and healthy(port)
        assert done.status == "failed"
        errors = done.errors.data
        assert [error.line for error in errors] == [2] and errors[0].param == "body.response_format.json_schema.schema"
        assert "levels deep" in errors[0].message
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(10)


def test_a_stored_validating_batch_with_a_poisoned_line_lets_the_node_start(tmp_path):
    store = BatchStore.open(tmp_path / "batches", max_file_bytes=2**30, max_storage_bytes=2**30)
    source = tmp_path / "upload.jsonl"
    source.write_bytes(lines())

    def stored() -> str:
        record = store.add_file(source, "in.jsonl", "batch")
        return store.create_batch(record.id, "/v1/chat/completions", "24h", None).id
    batch_id = store._thread.submit(stored).result()
    store.close()
    port = free_port()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    node = start(tmp_path, port, tmp_path / "submits.log")
    try:
        done = wait_done(client, batch_id, node)
        time.sleep(0.2)
        assert node.poll() is None and healthy(port)
        assert done.status == "failed" and [error.line for error in done.errors.data] == [2]
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(10)
