"""The Batch API through the official `openai` client, on the fake engine (tests/node/fake_engine.py).

The fake answers every prompt deterministically and can be held, which is what upload,
create, poll, download, cancel, validation and the L1 replay of a repeated batch need;
what a batch does on the real model (priority against live requests, a killed node) is
tested in tests/node/batches/.
"""

from __future__ import annotations

import asyncio
import time

import openai
import orjson
import pytest

from node.engine.types import BATCH
from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")


@pytest.fixture(scope="module")
def node(fake, tmp_path_factory):
    settings = node_settings(fake.config.model_path, tmp_path_factory.mktemp("home"), **{
        "arca.observe": False, "batch.max_lines": 20, "batch.max_file_mb": 1, "stats.sample_seconds": 1})
    with LiveNode(settings, engine=fake) as live:
        yield live


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat_line(custom_id: str, text: str, **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake", "messages": [{"role": "user", "content": text}], "max_tokens": 30,
                     "temperature": 0, **extra}}


def jsonl(lines: list) -> bytes:
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)


def wait(client, batch_id: str, statuses=("completed", "failed", "cancelled"), timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.05)
    raise TimeoutError(f"batch {batch_id} is still {batch.status}")


def run_batch(client, lines: list):
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "test"})
    assert batch.object == "batch" and batch.status in ("validating", "in_progress")
    return uploaded, wait(client, batch.id)


def records(client, file_id: str) -> list[dict]:
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_upload_create_poll_download_in_input_order(client, fake):
    lines = [chat_line(f"req-{i}", f"question number {i} " + "x" * i) for i in range(8)]
    lines.insert(3, chat_line("too-long", "y", max_tokens=5000))  # fails alone, at run time
    before = len(fake.submitted)
    uploaded, batch = run_batch(client, lines)
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    assert batch.status == "completed" and batch.metadata == {"job": "test"}
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (9, 8, 1)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.errors is None
    output = records(client, batch.output_file_id)
    assert [r["custom_id"] for r in output] == [f"req-{i}" for i in range(8)]
    for i, record in enumerate(output):
        assert record["id"].startswith("batch_req_") and record["error"] is None
        response = record["response"]
        assert response["status_code"] == 200 and response["request_id"] == response["body"]["id"]
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["content"].startswith("Fake answer to")
    errors = records(client, batch.error_file_id)
    assert [e["custom_id"] for e in errors] == ["too-long"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    ran = fake.submitted[before:]
    assert len(ran) == 8 and all(request.priority == BATCH for request in ran)


def test_a_repeated_batch_is_answered_from_l1_and_the_stats_say_so(client, fake, node):
    lines = [chat_line(f"again-{i}", f"repeat me {i}") for i in range(4)]
    run_batch(client, lines)
    node.call(node.state.service.drain())
    before = len(fake.submitted)
    _, batch = run_batch(client, lines)
    assert batch.request_counts.completed == 4 and len(fake.submitted) == before
    status, _, stats = http_json("GET", f"{node.url}/v1/reame/stats")
    assert status == 200 and stats["object"] == "reame.stats"
    total = stats["since_start"]
    assert total["tokens_served"] >= total["saved"]["l1"]["tokens"] > 0 and 0 < total["saved"]["l1"]["share"] <= 1
    assert total["busy_seconds"] > 0 and total["effective_tokens_per_second"] > 0
    assert total["plain_tokens_per_second"] is None  # no speculation controller, no calibration
    assert stats["window"]["tokens_served"] <= total["tokens_served"] and stats["trend"]


def test_bad_lines_fail_the_batch_with_their_line_numbers(client):
    lines = [chat_line("ok-1", "fine"), {"method": "POST", "url": "/v1/chat/completions", "body": {}},
             chat_line("bad-type", "x", max_tokens="5"), chat_line("ok-1", "duplicate id"),
             {**chat_line("wrong-url", "x"), "url": "/v1/completions"}]
    _, batch = run_batch(client, lines)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [(2, "missing_custom_id", "custom_id"), (3, "invalid_value", "body.max_tokens"),
                     (4, "duplicate_custom_id", "custom_id"), (5, "mismatched_endpoint", "url")]
    assert all(e.message.startswith(f"Line {e.line}:") for e in batch.errors.data)


def test_cancel_keeps_what_finished(client, fake, node):
    fake.hold = asyncio.Event()
    try:
        uploaded = client.files.create(file=("held.jsonl", jsonl([chat_line(f"h{i}", f"held {i}") for i in range(5)])),
                                       purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait(client, batch.id, ("in_progress",))
        cancelled = client.batches.cancel(batch.id)
        assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at
        final = wait(client, batch.id)
    finally:
        node._loop.call_soon_threadsafe(fake.hold.set)
    assert final.status == "cancelled" and final.cancelled_at
    assert final.request_counts.total == 5 and final.request_counts.completed == 0
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(run_batch(client, [chat_line("done", "done")])[1].id)  # completed: too late
    fake.hold = None


def test_files_list_retrieve_delete_and_upload_checks(client, node):
    uploaded = client.files.create(file=("a.jsonl", jsonl([chat_line("a", "a")])), purpose="batch")
    assert client.files.retrieve(uploaded.id).filename == "a.jsonl"
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.BadRequestError, match="Line 2"):
        client.files.create(file=("b.jsonl", b'{"custom_id": "x"}\nnot json\n'), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("c.jsonl", jsonl([chat_line("c", "c")])), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="max_lines"):
        client.files.create(file=("d.jsonl", jsonl([chat_line(f"d{i}", "d") for i in range(21)])), purpose="batch")
    with pytest.raises(openai.APIStatusError) as too_big:
        client.files.create(file=("e.jsonl", b"{}\n" * 400_000), purpose="batch")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    listed = client.batches.list(limit=2)
    assert len(listed.data) == 2 and listed.has_more


def test_the_batch_api_needs_the_key_like_every_route(fake, tmp_path):
    settings = node_settings(fake.config.model_path, tmp_path, **{"server.api_key": "sesame"})
    with LiveNode(settings, engine=fake) as live:
        status, _, body = http_json("GET", f"{live.url}/v1/files")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        keyed = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sesame", max_retries=0)
        assert keyed.files.list().data == []
        assert http_json("GET", f"{live.url}/v1/reame/stats")[0] == 401
