"""Batch lines answered from L1 yield to live requests (the fake engine, tests/node/fake_engine.py,
stands in for the model: a replay never reaches the engine, and the fake can hold a live
generation open as long as the test needs, which the real model cannot be made to do).

While a live request is being answered, a batch's lines go one per interval, so a batch of
cached lines cannot fill the event loop; once the live request ends, the rest run at once.
"""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import orjson
import pytest

from node.engine.types import BATCH
from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.fake_engine import FakeEngine

LINES = 24
INTERVAL_S = 0.4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")
    settings = node_settings(engine.config.model_path, tmp_path_factory.mktemp("home"), **{"arca.observe": False})
    with LiveNode(settings, engine=engine) as live:
        live.state.service.live_first.interval_s = INTERVAL_S
        yield live, engine, openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)


def start_batch(client):
    lines = b"".join(orjson.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "fake", "messages": [{"role": "user", "content": f"cached line {i}"}],
                 "max_tokens": 30, "temperature": 0}}) + b"\n" for i in range(LINES))
    uploaded = client.files.create(file=("input.jsonl", lines), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")


def batch_submits(engine) -> int:
    return sum(request.priority == BATCH for request in engine.submitted)


def finished(client, batch_id: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status != "completed":
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.05)
    return batch


def test_replayed_batch_lines_wait_for_a_live_request(served):
    node, engine, client = served
    finished(client, start_batch(client).id)  # every line now in L1
    node.call(node.state.service.drain())

    async def hold() -> None:
        engine.hold = asyncio.Event()
    node.call(hold())
    live: dict = {}
    asker = threading.Thread(target=lambda: live.update(reply=http_json("POST", f"{node.url}/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a live question"}], "max_tokens": 10, "temperature": 0})))
    asker.start()
    try:
        deadline = time.monotonic() + 10
        while node.state.service.live_first.active == 0:
            assert time.monotonic() < deadline, "the live request never started"
            time.sleep(0.01)
        submitted = batch_submits(engine)
        batch = start_batch(client)
        time.sleep(4 * INTERVAL_S)
        done = client.batches.retrieve(batch.id).request_counts.completed
        # one line per interval while the live request is answered (a few, never the whole batch)
        assert done <= 6, f"{done} of {LINES} replayed lines ran beside a live request"
    finally:
        async def release() -> None:
            assert engine.hold is not None
            engine.hold.set()
            engine.hold = None
        node.call(release())
        asker.join(30)
    assert live["reply"][0] == 200
    started = time.monotonic()
    batch = finished(client, batch.id)
    assert batch.request_counts.completed == LINES and time.monotonic() - started < 4 * INTERVAL_S
    assert batch_submits(engine) == submitted  # every line was an L1 replay
    assert node.state.service.live_first.waited >= 1
