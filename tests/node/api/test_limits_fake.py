"""Per-client bounds and request hygiene over real HTTP, on the fake engine (no model needed):
sessions one client may hold, two Authorization headers, 404 bodies naming huge ids.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.fake_engine import FakeEngine

KEY = "fake-key"
PER_CLIENT = 5


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return FakeEngine(tmp_path_factory.mktemp("model") / "fake.gguf")


@pytest.fixture(scope="module")
def node(fake, tmp_path_factory):
    flags = {"arca.observe": False, "server.max_sessions": 8, "server.max_sessions_per_client": PER_CLIENT}
    settings = node_settings(fake.config.model_path, tmp_path_factory.mktemp("home"), **flags)
    with LiveNode(settings, engine=fake) as live:
        yield live


def test_one_client_cannot_evict_the_sessions_of_others(node):
    status, _, theirs = http_json("POST", f"{node.url}/v1/sessions", headers={"Authorization": "Bearer someone"})
    assert status == 200
    mine = []
    for _ in range(PER_CLIENT):
        status, _, created = http_json("POST", f"{node.url}/v1/sessions")
        assert status == 200
        mine.append(created["id"])
    for _ in range(3):  # past the bound: a clear 429 each time, nobody's session dropped
        status, _, body = http_json("POST", f"{node.url}/v1/sessions")
        assert status == 429, body
        assert body["error"]["code"] == "too_many_sessions" and "max_sessions_per_client" in body["error"]["message"]
    for sid in [theirs["id"], *mine]:
        assert http_json("GET", f"{node.url}/v1/sessions/{sid}")[0] == 200
    assert http_json("DELETE", f"{node.url}/v1/sessions/{mine[0]}")[0] == 200  # room again for this client
    assert http_json("POST", f"{node.url}/v1/sessions")[0] == 200


def test_a_404_does_not_echo_a_huge_id(node):
    huge = "x" * 20_000
    asks = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "session": huge}),
            ("/v1/batches", {"input_file_id": huge, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "model": huge})]
    for path, body in asks:
        status, _, reply = http_json("POST", f"{node.url}{path}", body)
        assert status == 404, reply
        assert len(reply["error"]["message"]) < 300, (path, len(reply["error"]["message"]))


async def raw_request(port: int, head: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


async def test_two_authorization_headers_are_refused(fake, tmp_path):
    settings = node_settings(fake.config.model_path, tmp_path, **{"server.api_key": KEY, "arca.observe": False})
    with LiveNode(settings, engine=fake) as node:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{node.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}) as response:
                assert response.status == 200
        for first, second in ((KEY, "wrong"), ("wrong", KEY), (KEY, KEY)):
            head = (f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {first}\r\n"
                    f"Authorization: Bearer {second}\r\nConnection: close\r\n\r\n").encode()
            status, body = await raw_request(node.port, head)
            assert status == 400, (first, second, body)
            assert orjson.loads(body)["error"]["code"] == "duplicate_header"
