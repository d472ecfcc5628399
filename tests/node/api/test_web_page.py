"""The chat page in a real headless Chromium against a live node on the real Gemma model.

Chromium is driven over its DevTools protocol (a websocket, spoken with aiohttp): the page
is opened with `?ask=...`, so its own JavaScript sends the question, streams the answer and
marks `body[data-state]` when done; then the page's own form asks the same question in a
new chat, which the node answers from L1. A screenshot is saved next to the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import subprocess
import time

import aiohttp
import orjson
import pytest

from tests.node.api.live import LiveNode, node_settings

pytestmark = pytest.mark.model
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
WAIT_FOR_ANSWER = """
new Promise((resolve) => {
  const check = () => {
    const state = document.body.dataset.state;
    if (state === "done" || state === "error") {
      resolve(JSON.stringify({
        state, error: document.getElementById("error").textContent,
        cache: document.getElementById("cache").textContent, speed: document.getElementById("speed").textContent,
        model: document.getElementById("model").textContent, archive: document.getElementById("archive").textContent,
        answers: [...document.querySelectorAll(".msg.assistant .text")].map((e) => e.textContent),
        meta: [...document.querySelectorAll(".msg.assistant .meta")].map((e) => e.textContent),
      }));
    } else setTimeout(check, 100);
  };
  check();
})
"""
ASK_IN_A_NEW_CHAT = """
document.getElementById("reset").click();
document.body.dataset.state = "idle";
document.getElementById("max-tokens").value = "12";
document.getElementById("prompt").value = "Say hi";
document.getElementById("ask").requestSubmit();
"""


class DevTools:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params):
        call_id = next(self.ids)
        await self.socket.send_str(orjson.dumps({"id": call_id, "method": method, "params": params}).decode())
        while True:
            message = orjson.loads((await self.socket.receive()).data)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        return result["result"].get("value")

    async def open(self, url: str, timeout: float = 30) -> None:
        """Navigate and wait until the page has loaded (its context survives navigation)."""
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if await self.evaluate("location.href + ' ' + document.readyState") == f"{url} complete":
                    return
            except RuntimeError:  # the old document's context went away mid-call
                pass
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{url} did not load")


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    with LiveNode(node_settings(gemma_path, tmp_path_factory.mktemp("home"))) as live:
        yield live


@pytest.fixture
def chromium(tmp_path):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield int(port_file.read_text().split()[0])
    finally:
        process.terminate()
        process.wait(10)


async def test_chat_round_trip_in_chromium(node, chromium, tmp_path):
    page_url = f"{node.url}/"
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://127.0.0.1:{chromium}/json/new?about:blank") as response:
            target = await response.json()
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            tools = DevTools(socket)
            await tools.open(page_url)
            await tools.evaluate(ASK_IN_A_NEW_CHAT)
            first = orjson.loads(await asyncio.wait_for(tools.evaluate(WAIT_FOR_ANSWER), 120))
            assert first["state"] == "done", first["error"]
            assert first["model"] == "model: gemma3-270m" and first["archive"] == "archive: embedded"
            assert first["cache"] == "cache: miss" and first["speed"].endswith("tok/s")
            assert first["answers"][0].strip()
            node.call(node.state.service.drain())  # the answer is in L1 before we ask again
            await tools.evaluate(ASK_IN_A_NEW_CHAT)
            second = orjson.loads(await asyncio.wait_for(tools.evaluate(WAIT_FOR_ANSWER), 120))
            assert second["state"] == "done", second["error"]
            assert second["cache"] == "cache: hit" and second["speed"] == "cached"
            assert second["answers"] == first["answers"]
            shot = await tools.call("Page.captureScreenshot", format="png")
    (tmp_path / "chat.png").write_bytes(base64.b64decode(shot["data"]))
    assert (tmp_path / "chat.png").stat().st_size > 1000
