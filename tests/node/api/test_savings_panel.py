"""The savings panel of the web page in a real headless Chromium, on the fake engine
(tests/node/fake_engine.py): after a few answers (one of them replayed from L1) the page's
own script has fetched /v1/reame/stats, written the figures and drawn the trend as SVG."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from tests.node.api.live import LiveNode, http_json, node_settings
from tests.node.api.test_web_page import DevTools, chromium  # noqa: F401  (the browser fixture)
from tests.node.fake_engine import FakeEngine

READ_PANEL = """
new Promise((resolve) => {
  const check = () => {
    if (Number(document.getElementById("savings").dataset.points) >= 2) {
      resolve(JSON.stringify({
        served: document.getElementById("saved-served").textContent,
        tiers: document.getElementById("saved-tiers").textContent,
        speed: document.getElementById("saved-speed").textContent,
        line: document.getElementById("trend-served").getAttribute("points"),
        box: document.getElementById("trend").getBoundingClientRect().height,
      }));
    } else setTimeout(check, 100);
  };
  check();
})
"""


@pytest.fixture
def node(tmp_path):
    fake = FakeEngine(tmp_path / "fake.gguf")
    settings = node_settings(fake.config.model_path, tmp_path / "home", **{"stats.sample_seconds": 1,
                                                                            "arca.observe": False})
    with LiveNode(settings, engine=fake) as live:
        yield live


async def test_the_savings_panel_plots_the_trend(node, chromium):  # noqa: F811
    chat = {"messages": [{"role": "user", "content": "panel"}], "max_tokens": 30, "temperature": 0}
    for body in (chat, {**chat, "messages": [{"role": "user", "content": "other"}]}):
        assert http_json("POST", f"{node.url}/v1/chat/completions", body)[0] == 200
    node.call(node.state.service.drain())
    assert http_json("POST", f"{node.url}/v1/chat/completions", chat)[1]["X-Reame-Cache"] == "hit"
    time.sleep(2.2)  # two samples of the trend
    served = http_json("GET", f"{node.url}/v1/reame/stats")[2]["since_start"]["tokens_served"]
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://127.0.0.1:{chromium}/json/new?about:blank") as response:
            target = await response.json()
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            tools = DevTools(socket)
            await tools.open(f"{node.url}/")
            panel = orjson.loads(await asyncio.wait_for(tools.evaluate(READ_PANEL), 30))
    assert panel["served"] == f"served {served} tokens" and served > 0
    assert panel["tiers"].startswith("L1 ") and not panel["tiers"].startswith("L1 0%")
    assert panel["speed"].startswith("effective ") and panel["speed"].endswith("tok/s")
    points = [tuple(map(float, pair.split(","))) for pair in panel["line"].split()]
    assert len(points) >= 2 and points[-1][0] == 300.0 and all(0 <= y <= 60 for _, y in points)
    assert min(y for _, y in points) < 58  # something was served: the line leaves the floor
    assert panel["box"] == 60
