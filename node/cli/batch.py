"""`reame batch INPUT.jsonl`: a Batch API input file answered into an output file, with progress.

Three ways to run the same lines (`{"custom_id", "method", "url", "body"}`, OpenAI's format):
- `--server URL` (default `--via batch-api`): uploaded to the node's Batch API, polled until
  done, its output and error files appended to the output; Ctrl-C cancels the batch and
  keeps what it finished;
- `--server URL --via requests`: each line POSTed to its endpoint, `--concurrency` at once;
- `MODEL`: the node opened in this process (node/assembly.py), lines answered by the node's
  own parser and service (node/api/batch_lines.py) without a socket: L1, the prefix cache
  and speculation apply exactly as on a node.
The output file (node/cli/batch_output.py) takes whole lines only, skips the custom_ids a
previous run answered, and ends in input order. The progress bar (rich, on stderr) shows
lines done, completion tokens per second, the ETA and what the node's archive saved since
the run started (L1 answers, prefix tokens restored, draft tokens accepted; from
/v1/reame/stats, so on a shared node it counts everyone's traffic).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

from node.cli.batch_output import OutputFile
from node.batches.lines import ENDPOINTS, LineResult, output_line

POLL_S = 0.5
Transport = Callable[[str, bytes], Awaitable[LineResult]]
Stats = Callable[[], Awaitable[dict | None]]


class BatchInputError(Exception):
    """The input file (or the node's verdict on it) stops the run."""


@dataclass(frozen=True, slots=True)
class Line:
    number: int
    custom_id: str
    url: str
    body: dict


def read_input(path: Path) -> list[Line]:
    lines: list[Line] = []
    seen: set[str] = set()
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BatchInputError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(value, dict) or not isinstance(value.get("custom_id"), str) or not value["custom_id"]:
            raise BatchInputError(f"{path}:{number}: each line needs a 'custom_id' string")
        if value["custom_id"] in seen:
            raise BatchInputError(f"{path}:{number}: custom_id {value['custom_id']!r} is used twice")
        seen.add(value["custom_id"])
        if value.get("url") not in ENDPOINTS or not isinstance(value.get("body"), dict):
            raise BatchInputError(f"{path}:{number}: 'url' must be one of {', '.join(ENDPOINTS)} and 'body' an object")
        lines.append(Line(number, value["custom_id"], value["url"], value["body"]))
    return lines


@dataclass(slots=True)
class Tally:
    total: int
    skipped: int
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    base: dict | None = None   # the node's since-start figures when the run began
    last: dict | None = None

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def add(self, result: LineResult) -> None:
        if result.ok:
            self.ok += 1
            self.tokens += int((result.body.get("usage") or {}).get("completion_tokens", 0))
        else:
            self.failed += 1

    def saved(self) -> dict[str, int]:
        if self.base is None or self.last is None:
            return {"l1": 0, "prefix": 0, "drafts": 0}
        a, b = self.base["saved"], self.last["saved"]
        return {"l1": b["l1"].get("answers", 0) - a["l1"].get("answers", 0),
                "prefix": b["prefix"]["tokens"] - a["prefix"]["tokens"],
                "drafts": b["drafts"]["tokens"] - a["drafts"]["tokens"]}

    def speed(self) -> float:
        return self.tokens / max(1e-6, time.monotonic() - self.started)

    def summary(self, path: Path) -> str:
        s = self.saved()
        return (f"{path}: {self.done} lines ({self.ok} ok, {self.failed} failed, {self.skipped} already done) in "
                f"{time.monotonic() - self.started:.1f} s, {self.speed():.1f} tok/s; saved: L1 {s['l1']} answers, "
                f"prefix {s['prefix']} tokens, drafts {s['drafts']} tokens")


class Display:
    """The progress bar: lines, tokens per second, ETA, savings."""

    def __init__(self, tally: Tally) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.tally = tally
        self.progress = Progress(
            TextColumn("[bold]batch"), BarColumn(), MofNCompleteColumn(), TextColumn("lines"),
            TextColumn("{task.fields[speed]}"), TextColumn("ETA"), TimeRemainingColumn(),
            TextColumn("{task.fields[saved]}"), console=Console(stderr=True), refresh_per_second=4)
        self.task = self.progress.add_task("batch", total=tally.total, speed="- tok/s", saved="")

    def update(self) -> None:
        s = self.tally.saved()
        self.progress.update(self.task, completed=self.tally.done, speed=f"{self.tally.speed():.1f} tok/s",
                             saved=f"saved: L1 {s['l1']} answers, prefix {s['prefix']} tok, drafts {s['drafts']} tok")

    async def follow(self, stats: Stats) -> None:
        """Refresh the figures until cancelled."""
        while True:
            figures = await stats()
            if figures is not None:
                self.tally.last = figures
            self.update()
            await asyncio.sleep(POLL_S)


async def run_lines(lines: list[Line], transport: Transport, out: OutputFile, tally: Tally, concurrency: int) -> None:
    """Each line through `transport`, `concurrency` at once, written as it finishes."""
    room = asyncio.Semaphore(max(1, concurrency))

    async def one(line: Line) -> None:
        async with room:
            while True:
                result = await transport(line.url, orjson.dumps(line.body))
                if not result.retry:
                    break
                await asyncio.sleep(1.0)
        out.write(output_line(line.custom_id, result))
        tally.add(result)

    await asyncio.gather(*(one(line) for line in lines))


class NodeClient:
    """A running node over HTTP: plain requests, the Batch API, its stats."""

    def __init__(self, url: str, api_key: str | None) -> None:
        import aiohttp

        self.base = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        await self.session.close()

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict]:
        async with self.session.request(method, self.base + path, **kwargs) as response:
            body = await response.read()
            try:
                parsed = orjson.loads(body) if body else {}
            except orjson.JSONDecodeError:
                parsed = {"error": {"message": body.decode("utf-8", "replace")[:200]}}
            return response.status, parsed

    async def checked(self, method: str, path: str, **kwargs: Any) -> dict:
        status, body = await self.json(method, path, **kwargs)
        if status >= 400:
            raise BatchInputError(f"{method} {path}: {status} {(body.get('error') or {}).get('message', body)}")
        return body

    async def post_line(self, url: str, body: bytes) -> LineResult:
        status, parsed = await self.json("POST", url, data=body, headers={"Content-Type": "application/json"})
        return LineResult(status, parsed, retry=status == 503)

    async def stats(self) -> dict | None:
        status, body = await self.json("GET", "/v1/reame/stats")
        return body.get("since_start") if status == 200 else None

    async def slots(self) -> int:
        status, body = await self.json("GET", "/health")
        return int((body.get("engine") or {}).get("slots_total", 4)) if status == 200 else 4

    async def content(self, file_id: str) -> bytes:
        async with self.session.get(f"{self.base}/v1/files/{file_id}/content") as response:
            if response.status >= 400:
                raise BatchInputError(f"GET /v1/files/{file_id}/content: {response.status}")
            return await response.read()


async def via_batch_api(client: NodeClient, lines: list[Line], out: OutputFile, tally: Tally) -> None:
    """One node batch per endpoint; Ctrl-C cancels it and keeps what it finished."""
    import aiohttp

    for endpoint in dict.fromkeys(line.url for line in lines):
        group = [line for line in lines if line.url == endpoint]
        payload = b"".join(orjson.dumps({"custom_id": line.custom_id, "method": "POST", "url": endpoint,
                                         "body": line.body}) + b"\n" for line in group)
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", payload, filename="reame-batch.jsonl", content_type="application/jsonl")
        uploaded = await client.checked("POST", "/v1/files", data=form)
        batch = await client.checked("POST", "/v1/batches", json={
            "input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": "24h"})
        counted = (tally.ok, tally.failed)
        try:
            batch = await poll(client, batch["id"], tally, counted)
        except asyncio.CancelledError:
            await client.json("POST", f"/v1/batches/{batch['id']}/cancel")
            batch = await poll(client, batch["id"], tally, counted)
            await collect(client, batch, out)
            raise
        await collect(client, batch, out)
        if batch["status"] == "failed":
            numbers = {i: line.number for i, line in enumerate(group, 1)}
            problems = "; ".join(f"input line {numbers.get(e.get('line'), '?')}: {e['message'].split(': ', 1)[-1]}"
                                 for e in (batch.get("errors") or {}).get("data", [])[:10])
            raise BatchInputError(f"the node refused the batch: {problems}")


async def poll(client: NodeClient, batch_id: str, tally: Tally, counted: tuple[int, int]) -> dict:
    while True:
        batch = await client.checked("GET", f"/v1/batches/{batch_id}")
        counts = batch["request_counts"]
        tally.ok, tally.failed = counted[0] + counts["completed"], counted[1] + counts["failed"]
        if tally.last is not None and tally.base is not None:
            tally.tokens = tally.last["completion_tokens"] - tally.base["completion_tokens"]
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        await asyncio.sleep(POLL_S)


async def collect(client: NodeClient, batch: dict, out: OutputFile) -> None:
    for key in ("output_file_id", "error_file_id"):
        if batch.get(key):
            for raw in (await client.content(batch[key])).splitlines():
                out.write(raw)


@dataclass(frozen=True, slots=True)
class Local:
    """A model loaded in this process: how lines run, its stats, its slots, how to close it."""

    transport: Transport
    stats: Stats
    slots: int
    close: Callable[[], Awaitable[None]]


async def open_local(settings: Any) -> Local:
    """The node opened in this process (node/assembly.py: its engine, archive, cache, speculation),
    its lines answered by node/api/batch_lines.py without a socket."""
    from node.api.batch_lines import ApiLines
    from node.api.state import NodeState
    from node.assembly import Node

    stack = contextlib.AsyncExitStack()
    node = await stack.enter_async_context(Node.open(settings))  # the model loads here

    async def stats() -> dict | None:
        return node.savings.report()["since_start"]

    slots = int(node.engine.stats().get("slots_total", 1) or 1)
    return Local(ApiLines(NodeState.of(node)).run, stats, slots, stack.aclose)


async def run(input_path: Path, output_path: Path, *, server: str | None, via: str, concurrency: int | None,
              api_key: str | None, local: Callable[[], Awaitable[Local]] | None = None) -> Tally:
    lines = read_input(input_path)
    out = OutputFile(output_path)
    answered = out.open()
    todo = [line for line in lines if line.custom_id not in answered]
    tally = Tally(total=len(todo), skipped=len(lines) - len(todo))
    if not todo:  # everything answered already: no node or model to ask
        out.close([line.custom_id for line in lines])
        return tally
    client: NodeClient | None = None
    closer: Callable[[], Awaitable[None]] | None = None
    try:
        if server is not None:
            client = NodeClient(server, api_key or os.environ.get("REAME_API_KEY"))
            stats: Stats = client.stats
            transport: Transport = client.post_line
            slots = await client.slots()
        else:
            assert local is not None
            opened = await local()
            transport, stats, slots, closer = opened.transport, opened.stats, opened.slots, opened.close
        tally.base = tally.last = await stats()
        display = Display(tally)
        with display.progress:
            follower = asyncio.create_task(display.follow(stats))
            try:
                if server is not None and via == "batch-api":
                    assert client is not None
                    await via_batch_api(client, todo, out, tally)
                else:
                    await run_lines(todo, transport, out, tally, concurrency or slots)
            finally:
                follower.cancel()
                tally.last = await stats() or tally.last
                display.update()
    finally:
        out.close([line.custom_id for line in lines])
        if client is not None:
            await client.close()
        if closer is not None:
            await closer()
    return tally
