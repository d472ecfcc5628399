"""Many streams against a node, some abandoned mid-stream, and the node's figures back at idle.

Shared by bench/soak.py and tests/e2e/test_node_load.py (which runs it bounded, with the
archive stopped, restarted and silenced under it):
- `stream_chat`: one streamed chat read to `[DONE]`, or abandoned after its first chunk
  (leaving the request closes the connection mid-stream);
- `stream_round`: `count` of them at once, a fraction abandoned, over one HTTP session;
- `idle_figures` / `wait_idle`: the engine's gauges from /health (slots, active and queued
  sequences, KV cells used and reserved), polled until they are back at an idle baseline;
- `rss_mib`: a process's resident set.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp

TOPICS = ["rivers", "colors", "fruits", "planets", "tools", "birds", "cities", "metals"]
# The /health engine gauges that must be back where they were at idle.
IDLE_KEYS = ("active", "queued", "slots_free", "kv_cells_used", "kv_cells_reserved")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def chat_body(rng: random.Random, number: int, *, max_tokens: int, stream: bool) -> dict:
    """A short question, greedy (an archive lookup first) or sampled, one in two each."""
    question = f"Name {rng.randint(2, 5)} {rng.choice(TOPICS)} ({number})."
    return {"model": "gemma3-270m", "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": rng.choice([0, 0.8]), "stream": stream}


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, abandon: bool) -> str:
    """"abandoned", "done", or what went wrong (a status, no `[DONE]`, an error event)."""
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return f"status {response.status}: {(await response.text())[:200]}"
        if abandon:
            await response.content.readany()
            return "abandoned"  # leaving the block closes the connection mid-stream
        text = await response.text()
    if "event: error" in text:
        return f"stream ended with an error event: {text[-300:]}"
    return "done" if "[DONE]" in text else "stream without [DONE]"


async def stream_round(url: str, count: int, abandon_fraction: float, rng: random.Random, *,
                       first_number: int = 0, max_tokens: int = 16, timeout_s: float = 120) -> Counter:
    """`count` streamed chats at once, `abandon_fraction` of them abandoned after their first
    chunk; a Counter of the outcomes ("done", "abandoned", anything else is a failure)."""
    abandon = set(rng.sample(range(count), round(count * abandon_fraction)))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(i: int) -> str:
            body = chat_body(rng, first_number + i, max_tokens=max_tokens, stream=True)
            try:
                return await stream_chat(session, url, body, i in abandon)
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                return f"client error {error!r}"

        return Counter(await asyncio.gather(*(one(i) for i in range(count))))


def idle_figures(url: str) -> dict[str, int]:
    """The engine gauges of /health that say whether the node is idle, plus slots_total."""
    with urllib.request.urlopen(url + "/health", timeout=10) as response:
        engine = json.loads(response.read())["engine"]
    return {key: int(engine[key]) for key in (*IDLE_KEYS, "slots_total")}


def wait_idle(url: str, baseline: dict[str, int], timeout_s: float = 10.0) -> tuple[dict[str, int], float]:
    """Poll /health until every idle gauge equals `baseline`'s (all slots free, nothing
    active or queued, KV cells back at the idle figure); (the last figures, seconds waited).
    The caller compares: on a timeout the last figures differ from the baseline."""
    started = time.monotonic()
    while True:
        figures = idle_figures(url)
        if all(figures[key] == baseline[key] for key in IDLE_KEYS) or time.monotonic() - started > timeout_s:
            return figures, time.monotonic() - started
        time.sleep(0.1)
