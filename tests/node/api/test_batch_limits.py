"""The Batch API's bounds and hygiene over real HTTP, on the fake engine (no model needed):
file names that are not header-safe, a second `file` part, files per client, a line's
`session`, the storage budget reached by results, and validation beside the store's thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import pytest

from node.batches.lines import LineResult
from node.batches.runner import BatchRunner
from node.batches.store import BatchStore
from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.fake_engine import FakeEngine

FILES_PER_CLIENT = 6
BOUNDARY = "limitsboundary"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    engine = FakeEngine(home / "fake.gguf")
    flags = {"arca.observe": False, "batch.max_storage_mb": 1, "batch.max_files_per_client": FILES_PER_CLIENT,
             "batch.directory": str(home / "batches")}
    with LiveNode(node_settings(engine.config.model_path, home, **flags), engine=engine) as live:
        yield live


@pytest.fixture
def fake(node):
    return node.engine


@pytest.fixture(autouse=True)
def clean(node, fake):
    yield
    fake.answers = None
    fake.logprob = None
    for record in http_json("GET", f"{node.url}/v1/files")[2]["data"]:
        http_json("DELETE", f"{node.url}/v1/files/{record['id']}")


def chat_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake", "messages": [{"role": "user", "content": custom_id}], "max_tokens": 30,
                     "temperature": 0, **body}}


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def multipart(*files: tuple[str, bytes]) -> bytes:
    """A form with purpose=batch and each (filename, content) as a `file` part, built by hand:
    the name goes as RFC 5987 `filename*` (how a client sends CR, LF or NUL in a name)."""
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'.encode()]
    for name, content in files:
        quoted = urllib.parse.quote(name, safe="")
        parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename*=UTF-8\'\'{quoted}'
                     f'\r\nContent-Type: application/jsonl\r\n\r\n'.encode() + content + b"\r\n")
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def upload(node: LiveNode, *files: tuple[str, bytes]) -> tuple[int, dict]:
    request = urllib.request.Request(f"{node.url}/v1/files", data=multipart(*files), method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_any_file_name_can_be_downloaded(node):
    content = jsonl([chat_line("a")])
    for name in ['in"put.jsonl', "a\rb.jsonl", "new\nline.jsonl", "nul\x00.jsonl", "café ☕.jsonl"]:
        status, record = upload(node, (name, content))
        assert record["filename"] == name
        assert status == 200, record
        with urllib.request.urlopen(f"{node.url}/v1/files/{record['id']}/content", timeout=30) as response:
            assert response.read() == content
            header = response.headers["Content-Disposition"]
        assert all(ch not in header for ch in "\r\n\x00")
        exact = header.split("filename*=UTF-8''", 1)[1]
        assert urllib.parse.unquote(exact) == record["filename"]


def test_a_second_file_part_is_refused_and_leaves_no_orphan(node):
    status, body = upload(node, ("one.jsonl", jsonl([chat_line("a")])), ("two.jsonl", jsonl([chat_line("b")])))
    assert status == 400 and body["error"]["param"] == "file", body
    assert http_json("GET", f"{node.url}/v1/files")[2]["data"] == []


def test_files_per_client_are_bounded(node):
    for number in range(FILES_PER_CLIENT):
        assert upload(node, (f"{number}.jsonl", jsonl([chat_line("a")])))[0] == 200
    status, body = upload(node, ("over.jsonl", jsonl([chat_line("a")])))
    assert status == 429 and body["error"]["code"] == "too_many_files", body
    assert "max_files_per_client" in body["error"]["message"]


def wait(node: LiveNode, batch_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = http_json("GET", f"{node.url}/v1/batches/{batch_id}")[2]
        if batch["status"] in ("completed", "failed", "cancelled"):
            return batch
        time.sleep(0.05)
    raise TimeoutError(batch)


def run(node: LiveNode, lines: list[dict]) -> dict:
    status, record = upload(node, ("in.jsonl", jsonl(lines)))
    assert status == 200, record
    status, _, batch = http_json("POST", f"{node.url}/v1/batches", {
        "input_file_id": record["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert status == 200, batch
    return wait(node, batch["id"])


def test_a_line_in_a_session_fails_validation(node):
    batch = run(node, [chat_line("a"), chat_line("b", session="sess_0123456789abcdef01234567")])
    assert batch["status"] == "failed"
    errors = batch["errors"]["data"]
    assert [(e["line"], e["param"]) for e in errors] == [(2, "body.session")], errors


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_results_past_the_storage_budget_fail_the_batch_not_the_node(node, fake):
    fake.answers = lambda request: "y" * 1500  # with logprobs each line's result is about 300 KB
    lines = [chat_line(f"l{i}", max_tokens=1500, logprobs=True, top_logprobs=3) for i in range(12)]
    batch = run(node, lines)
    assert batch["status"] == "failed", batch
    assert [e["code"] for e in batch["errors"]["data"]] == ["storage_full"]
    assert batch["output_file_id"] is None
    directory = Path(node.settings.batch.directory)
    assert directory_bytes(directory) < 3 * 2**20, sorted((f.name, f.stat().st_size) for f in directory.rglob("*"))
    wal = directory / "batches.db-wal"
    assert not wal.exists() or wal.stat().st_size < 2**20
    fake.answers = None
    status, _, answer = http_json("POST", f"{node.url}/v1/chat/completions", {"messages": [{"role": "user",
                                  "content": "still here"}], "max_tokens": 10})
    assert status == 200, answer
    assert run(node, [chat_line("small")])["status"] == "completed"  # the budget is free again


class SlowChecks:
    """A line executor whose check waits until released (a fake: a body that takes seconds to
    check cannot be made on demand without depending on how fast the schema checker is)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.checking = threading.Event()

    def check(self, endpoint: str, body: dict) -> None:
        self.checking.set()
        self.release.wait(30)

    async def run(self, url: str, body: bytes, tenant: str = "") -> LineResult:
        return LineResult(200, {"ok": True})


async def test_validation_does_not_hold_the_store_thread(tmp_path):
    store = BatchStore.open(tmp_path, max_file_bytes=2**20, max_storage_bytes=2**24)
    executor = SlowChecks()
    runner = BatchRunner(store, executor, concurrency=1, max_lines=10)  # type: ignore[arg-type]
    try:
        source = tmp_path / "input"
        source.write_bytes(jsonl([chat_line("a")]))
        record = await store.call(store.add_file, source, "in.jsonl", "batch")
        await store.call(store.create_batch, record.id, "/v1/chat/completions", "24h", None)
        runner.start()
        assert await asyncio.to_thread(executor.checking.wait, 10)
        started = time.perf_counter()
        files = await asyncio.wait_for(store.call(store.list_files, None, 10, None), 5)
        assert [f.id for f in files] == [record.id] and time.perf_counter() - started < 1
    finally:
        executor.release.set()
        await runner.close()
        store.close()
