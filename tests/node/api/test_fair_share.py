"""One request cannot take every KV cell or slot: the per-sequence context, the slots one
request holds, and 503 + Retry-After past the queue's wait bound, on the real Gemma model
through the real aiohttp server.

The node: 2048 cells and 4 slots, so 512 cells per sequence and 3 slots per request; a live
request waits at most 8 s for room. A "hog" bans every end-of-generation token, so it runs to
its max_tokens unless its client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator, Callable

import aiohttp
import orjson
import pytest

from node.assembly import open_engine
from tests.node.api.live import LiveNode, http_json, node_settings, settled

pytestmark = pytest.mark.model
WAIT_S = 3.0  # under what 4 hogs of 480 plain tokens take on a fast host (6 s at 320 tok/s); a loaded host only lengthens them
# sampled: never answered from L1, so it needs the engine every time
CHAT = {"model": "gemma3-270m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0.8}


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    flags = {"server.max_queue_wait_s": WAIT_S, "cache.enabled": True, "model.context_length": 2048}
    settings = node_settings(gemma_path, tmp_path_factory.mktemp("fair"), **flags)
    engine = open_engine(settings, progress=False)
    live = LiveNode(settings, engine=engine).start()
    banned = {str(token): -100 for token in engine.model_info.eog_tokens}  # the first steps (calibration,
    http_json("POST", f"{live.url}/v1/chat/completions", {**CHAT, "logit_bias": banned})  # first decodes) done
    yield live
    live.stop()
    engine.close()


def hog(node: LiveNode, max_tokens: int, **extra: object) -> dict:
    banned = {str(token): -100 for token in node.state.engine.model_info.eog_tokens}
    return {"model": "gemma3-270m", "messages": [{"role": "user", "content": "Count to a million."}],
            "max_tokens": max_tokens, "temperature": 0.8, "logit_bias": banned, "stream": True,
            "speculation": False, **extra}  # plain decoding: drafted counting could end a hog inside the bound


@contextlib.asynccontextmanager
async def running(node: LiveNode, bodies: list[dict]) -> AsyncIterator[None]:
    """The bodies streaming (each past its first chunk), cancelled by leaving when done."""
    async with aiohttp.ClientSession() as session:
        responses = [await session.post(f"{node.url}/v1/chat/completions", json=body) for body in bodies]
        try:
            for response in responses:
                assert response.status == 200, await response.text()
                await response.content.readline()
            yield
        finally:
            for response in responses:
                response.close()
    settled(node, 30)


async def until(node: LiveNode, ready: Callable[[dict], bool], timeout: float = 30) -> dict:
    """The engine's stats once `ready` holds for them (the engine admits on its own thread)."""
    deadline = time.monotonic() + timeout
    while not ready(stats := node.state.engine.stats()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return stats


async def post(node: LiveNode, path: str, body: dict) -> tuple[int, dict, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{node.url}{path}", data=orjson.dumps(body)) as response:
            return response.status, dict(response.headers), await response.read()


async def test_a_request_over_the_per_sequence_context_is_a_400(node):
    status, _, raw = await post(node, "/v1/chat/completions", {**hog(node, 1000), "stream": False})
    error = orjson.loads(raw)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded", error
    assert "512 tokens per sequence" in error["message"]
    status, _, raw = await post(node, "/v1/warm", {"prompt": "word " * 900})
    error = orjson.loads(raw)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded", error
    assert node.state.engine.stats()["kv_cells_reserved"] == 0


async def test_many_choices_leave_a_slot_for_a_small_chat(node):
    async with running(node, [hog(node, 480, n=4)]):
        stats = await until(node, lambda stats: stats["active"] == 3)
        assert stats["queued"] == 1, stats  # the fourth choice waits its turn
        started = time.perf_counter()
        status, _, raw = await post(node, "/v1/chat/completions", CHAT)
        took = time.perf_counter() - started
        assert status == 200, raw
        stats = node.state.engine.stats()
        assert stats["active"] == 3, stats  # it answered while the hog still runs
    assert took < 30, f"the small chat took {took:.1f} s beside a request of n=4"


async def test_a_full_node_answers_503_with_retry_after(node):
    async with running(node, [hog(node, 480) for _ in range(4)]):
        async def refused(stream: bool) -> None:
            started = time.perf_counter()
            status, headers, raw = await post(node, "/v1/chat/completions", {**CHAT, "stream": stream})
            took = time.perf_counter() - started
            assert status == 503, raw
            assert orjson.loads(raw)["error"]["code"] == "overloaded"
            assert int(headers["Retry-After"]) >= 1
            assert WAIT_S <= took < WAIT_S + 20

        # both at once: the hogs (4 x 480 tokens) outlast one wait, not always two in a row on a fast host
        await asyncio.gather(refused(False), refused(True))
        assert node.state.engine.stats()["queued"] == 0
    status, _, _ = await post(node, "/v1/chat/completions", CHAT)  # room again once the hogs left
    assert status == 200


async def test_a_warm_on_a_full_node_answers_503(node):
    async with running(node, [hog(node, 480) for _ in range(4)]):
        status, headers, raw = await post(node, "/v1/warm", {"prompt": "A document to warm. " * 10})
        assert status == 503, raw
        assert int(headers["Retry-After"]) >= 1

