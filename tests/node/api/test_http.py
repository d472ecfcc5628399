"""Raw HTTP against live nodes on the real Gemma model: errors, SSE bytes, auth, limits, cancel.

One engine is loaded for the module and shared by three nodes (plain, keyed, and one that
admits a single request at a time), each with its own archive.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import aiohttp
import orjson
import pytest

from node.api.schemas import parse_chat
from node.assembly import open_engine
from tests.node.api.live import LiveNode, node_settings

pytestmark = pytest.mark.model
KEY = "s3cret-key"
CHAT = {"model": "gemma3-270m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def engine(gemma_path, tmp_path_factory):
    engine = open_engine(node_settings(gemma_path, tmp_path_factory.mktemp("engine")), progress=False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def nodes(engine, gemma_path, tmp_path_factory):
    def make(**flags):
        return LiveNode(node_settings(gemma_path, tmp_path_factory.mktemp("home"), **flags), engine=engine).start()

    started = {"plain": make(), "keyed": make(**{"server.api_key": KEY}),
               "single": make(**{"server.max_concurrent_requests": 1})}
    yield started
    for node in started.values():
        node.stop()


@pytest.fixture
def plain(nodes):
    return nodes["plain"]


async def post(url: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=data, headers=headers or {}) as response:
            return response.status, dict(response.headers), orjson.loads(await response.read())


def assert_envelope(body: dict, error_type: str, param: str | None = None) -> dict:
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["type"] == error_type and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"\xff\xfe\x00garbage", "invalid_json"),
        (b"[" * 5000 + b"]" * 5000, "invalid_json"),
        (b"[1, 2]", None),
        (b'"a string"', None),
    ],
)
async def test_bodies_that_are_not_json_objects(plain, body, code):
    status, _, reply = await post(f"{plain.url}/v1/chat/completions", body)
    assert status == 400
    error = assert_envelope(reply, "invalid_request_error")
    if code:
        assert error["code"] == code


@pytest.mark.parametrize(
    "path, change, param",
    [
        ("chat", {"max_tokens": "5"}, "max_tokens"),
        ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ("chat", {"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0].content"),
        ("chat", {"temperature": "0"}, "temperature"),
        ("chat", {"stop": {"a": 1}}, "stop"),
        ("chat", {"n": 1.5}, "n"),
        ("chat", {"logit_bias": {"1": "x"}}, "logit_bias"),
        ("chat", {"stream": 1}, "stream"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type"),
        ("text", {"prompt": {"x": 1}}, "prompt"),
        ("text", {"prompt": [999999999]}, "prompt"),
        ("text", {"prompt": "x", "max_tokens": 100000}, "max_tokens"),
        ("chat", {"seed": -5}, "seed"),
        ("chat", {"top_p": 0}, "top_p"),
        ("text", {"prompt": "x", "repeat_penalty": 0.001}, "repeat_penalty"),
        ("text", {"prompt": "x", "seed": -(2**63)}, "seed"),
        ("chat", {"logit_bias": {"999999": 5}}, "logit_bias"),
        ("text", {"prompt": "x", "logit_bias": {"262144": -1}}, "logit_bias"),
    ],
)
async def test_wrong_fields_are_400_naming_the_field(plain, path, change, param):
    base = CHAT if path == "chat" else {"model": "gemma3-270m", "prompt": "Hi", "max_tokens": 2}
    url = f"{plain.url}/v1/{'chat/completions' if path == 'chat' else 'completions'}"
    status, _, reply = await post(url, {**base, **change})
    assert status == 400
    assert_envelope(reply, "invalid_request_error", param)


async def test_a_prompt_longer_than_the_context(plain):
    long_chat = {**CHAT, "messages": [{"role": "user", "content": "many words " * 20000}]}
    status, _, reply = await post(f"{plain.url}/v1/chat/completions", long_chat)
    assert status == 400
    assert assert_envelope(reply, "invalid_request_error")["code"] == "context_length_exceeded"


async def test_routing_errors_and_body_limit(plain):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{plain.url}/v1/chat/completions") as response:
            assert response.status == 405 and "POST" in response.headers["Allow"]
            assert_envelope(await response.json(), "invalid_request_error")
        async with session.post(f"{plain.url}/v1/nothing", json={}) as response:
            assert response.status == 404
            assert_envelope(await response.json(), "invalid_request_error")
        huge = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]})
        async with session.post(f"{plain.url}/v1/chat/completions", data=huge) as response:
            assert response.status == 413
            assert_envelope(await response.json(), "invalid_request_error")
        async with session.post(f"{plain.url}/v1/chat/completions", json={**CHAT, "model": "nope"}) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "model_not_found"
        async with session.get(f"{plain.url}/health") as response:  # nothing above hurt the node
            assert response.status == 200 and (await response.json())["archive"] == "embedded"


async def test_sse_framing_byte_by_byte(plain):
    body = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Frame me."}]}
    for expected_cache in ("miss", "hit"):  # the replayed hit frames exactly like the generation
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{plain.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                assert response.headers["X-Reame-Cache"] == expected_cache
                raw = await response.read()
        assert raw.endswith(b"\n\ndata: [DONE]\n\n")
        frames = raw.split(b"\n\n")
        assert frames[-1] == b"" and frames[-2] == b"data: [DONE]"
        chunks = []
        for frame in frames[:-2]:
            assert frame.startswith(b"data: ") and b"\n" not in frame
            chunks.append(orjson.loads(frame[len(b"data: "):]))
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        ids = {chunk["id"] for chunk in chunks}
        assert len(ids) == 1 and all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finish) == 1 and finish[0] is chunks[-2]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        if expected_cache == "miss":
            first_text, first_usage = text, chunks[-1]["usage"]
        else:
            usage = chunks[-1]["usage"]
            assert (text, {**usage, "prompt_tokens_details": {"cached_tokens": 0}}) == (first_text, first_usage)
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]  # an L1 replay


async def wait_idle(engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.stats()["active"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.stats()["active"] == 0


def endless(engine) -> dict:
    """A bias that keeps the model from ending its answer on its own."""
    return {"logit_bias": {str(token): -100 for token in engine.model_info.eog_tokens}}


async def test_disconnect_cancels_streamed_and_unstreamed_generations(plain, engine):
    body = {**CHAT, "max_tokens": 900, "temperature": 0.8, **endless(engine),
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    greedy = {**body, "temperature": 0, "stream": True}
    before = engine.stats()["generated_tokens"]
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{plain.url}/v1/chat/completions", json=greedy)
        await response.content.readuntil(b"\n\n")
        await response.content.readuntil(b"\n\n")  # generation is under way
        response.close()
    await wait_idle(engine)
    service = plain.state.service
    plain.call(service.drain())
    key = service.plan_chat(parse_chat(greedy)).jobs[0].key
    assert key is not None and plain.call(plain.state.archive.get(key)) is None  # a cancelled answer is not stored
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(f"{plain.url}/v1/chat/completions", json=body)
    left_at = engine.stats()["generated_tokens"]
    await wait_idle(engine)
    after = engine.stats()["generated_tokens"]
    assert after - left_at < 100  # the unstreamed one stopped within a few steps of its client leaving
    assert after - before < 900  # neither ran to its 900 (a fast host makes a few hundred in the second)


async def test_auth_on_everything_but_health(nodes):
    keyed = nodes["keyed"]
    good = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{keyed.url}/health") as response:
            assert response.status == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions")):
                async with session.request(method, f"{keyed.url}{path}", json=CHAT, headers=headers) as response:
                    assert response.status == 401
                    assert_envelope(await response.json(), "authentication_error")
        async with session.post(f"{keyed.url}/v1/chat/completions", json=CHAT, headers=good) as response:
            assert response.status == 200
        async with session.get(f"{keyed.url}/v1/models", headers=good) as response:
            assert response.status == 200


async def test_over_the_in_flight_limit_is_503_with_retry_after(nodes, engine):
    single = nodes["single"]
    body = {**CHAT, "max_tokens": 900, "temperature": 0.8, "stream": True, **endless(engine)}
    async with aiohttp.ClientSession() as session:
        running = await session.post(f"{single.url}/v1/chat/completions", json=body)
        await running.content.readuntil(b"\n\n")
        async with session.post(f"{single.url}/v1/chat/completions", json=CHAT) as response:
            assert response.status == 503
            assert int(response.headers["Retry-After"]) >= 1
            assert_envelope(await response.json(), "server_error")["code"] == "overloaded"
        running.close()
    await wait_idle(engine)


async def test_metrics_are_prometheus_text(plain):
    await post(f"{plain.url}/v1/chat/completions", CHAT)
    await post(f"{plain.url}/v1/chat/completions", CHAT)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{plain.url}/metrics") as response:
            assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
            text = await response.text()
    for series in ('reame_requests_total{route="/v1/chat/completions",status="200"}',
                   'reame_requests_total{route="/v1/chat/completions",status="400"}',
                   "reame_archive_hits_total", "reame_archive_misses_total", "reame_prompt_tokens_total",
                   "reame_generated_tokens_total", "reame_time_to_first_token_seconds_bucket",
                   "reame_request_latency_seconds_bucket", "reame_queue_depth", "reame_active_sequences",
                   'reame_archive_errors_total{operation="get"}', "reame_archive_up 1.0",
                   "reame_slot_refill_ratio 0.0"):  # one request at a time: no slot freed mid-batch
        assert series in text, series
    hits = next(line for line in text.splitlines() if line.startswith("reame_archive_hits_total"))
    assert float(hits.split()[-1]) >= 1


async def test_seed_minus_one_asks_for_a_random_seed(plain):
    for _ in range(2):
        status, _, reply = await post(f"{plain.url}/v1/chat/completions", {**CHAT, "seed": -1, "temperature": 0.9})
        assert status == 200 and reply["choices"][0]["finish_reason"] in ("length", "stop")


async def test_a_flood_of_bad_seeds_leaves_the_node_serving(nodes):
    single = nodes["single"]  # one request in flight at most: a leaked place would lock it out
    for _ in range(6):
        status, _, _ = await post(f"{single.url}/v1/chat/completions", {**CHAT, "seed": -7, "temperature": 0.8})
        assert status == 400
    status, _, reply = await post(f"{single.url}/v1/chat/completions", {**CHAT, "seed": 7, "temperature": 0.8})
    assert status == 200


def raw_http(port: int, data: bytes, timeout: float = 10.0) -> tuple[float, bytes]:
    """Send raw bytes, return (seconds until the first reply bytes, the reply's start)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(data)
        reply = sock.recv(4096)
        return time.monotonic() - started, reply


async def test_bearer_bytes_that_are_not_utf8_are_401(nodes):
    keyed = nodes["keyed"]
    for token in (b"\xff\xfe", b"\xc3", "ñé".encode()):
        request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                   b"\r\nContent-Length: 2\r\n\r\n{}")
        _, reply = await asyncio.to_thread(raw_http, keyed.port, request)
        assert reply.startswith(b"HTTP/1.1 401"), reply[:80]


async def test_a_declared_length_over_the_limit_is_413_before_the_body(plain):
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: 99999999999\r\n\r\n{\"mod")
    waited, reply = await asyncio.to_thread(raw_http, plain.port, request)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:80]
    assert waited < 5  # answered without waiting for the 100 GB it announced
    assert b"request_too_large" in reply


async def test_malformed_http_is_one_warning_line_not_a_traceback(plain, caplog):
    with caplog.at_level(logging.INFO):
        for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
                     b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n"):
            _, reply = await asyncio.to_thread(raw_http, plain.port, junk)
            assert reply.startswith(b"HTTP/1.") and b" 400 " in reply[:20], reply[:80]
        await asyncio.sleep(0.2)
    server_records = [r for r in caplog.records if r.name.startswith(("aiohttp", "node.api"))]
    assert server_records, "the malformed requests were not logged at all"
    for record in server_records:
        assert record.levelno <= logging.WARNING and record.exc_info is None, record.getMessage()
        assert "malformed HTTP request" in record.getMessage()
