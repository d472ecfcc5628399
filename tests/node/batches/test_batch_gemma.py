"""A batch on the real Gemma model beside live requests, through the official `openai` client.

Two slots, one kept for interactive work (`[batch] interactive_slots = 1`), a 128-token
context per slot. While the batch runs, a live request is answered after at most the batch
lines already in flight: it never waits behind the batch's queue (an ordering property,
checked on the batch's own counts, not a timing). The stats then show computed tokens and
the plain rate the speculation controller calibrated at start.
"""

from __future__ import annotations

import time

import openai
import orjson
import pytest

from tests.node.api.live import LiveNode, http_json, node_settings

pytestmark = pytest.mark.model
LINES = 6


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("home"), **{
        "model.context_length": 256, "server.parallel": 2, "arca.observe": False})
    with LiveNode(settings) as live:
        deadline = time.monotonic() + 120
        while not live.state.speculation.costs.measured:  # calibration gives way to requests: let it end
            assert time.monotonic() < deadline, "no start-up calibration"
            time.sleep(0.05)
        yield live


def test_a_live_request_overtakes_the_batch_and_the_stats_count_it(node):
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": f"Item {i}: the colour of the sky is", "max_tokens": 4, "temperature": 0}}
             for i in range(LINES)]
    uploaded = client.files.create(file=("in.jsonl", b"\n".join(orjson.dumps(line) for line in lines)),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while (before := client.batches.retrieve(batch.id)).request_counts.completed < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    live = client.completions.create(model="gemma3-270m", prompt="Hello, my name is", max_tokens=8, temperature=0)
    after = client.batches.retrieve(batch.id)
    assert live.choices[0].text and live.usage.completion_tokens > 0
    # one batch line runs at a time (2 slots - 1 kept); the live request took the kept slot
    assert after.request_counts.completed - before.request_counts.completed <= 2
    assert after.request_counts.completed < LINES
    while (done := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline, done.status
        time.sleep(0.05)
    assert done.request_counts.completed == LINES
    output = [orjson.loads(line) for line in client.files.content(done.output_file_id).content.splitlines()]
    assert [record["custom_id"] for record in output] == [line["custom_id"] for line in lines]
    total = http_json("GET", f"{node.url}/v1/reame/stats")[2]["since_start"]
    assert total["tokens_computed"] > 0 and total["completion_tokens"] >= LINES
    assert total["plain_tokens_per_second"] > 0 and total["speedup"] > 0
