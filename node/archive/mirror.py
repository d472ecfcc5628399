"""The L4 mirror: the fleet's corpus of past generations of one model, copied incrementally
into this node so drafting from it never waits on the network.

A background task asks the archive for the streams after its cursor (`ARCA.SINCE NS <model
fingerprint> <cursor> COUNT n`), hands each stream to a sink (the Palimpsest's `add`, which
queues it for the engine thread) and moves the cursor on. While a reply is full it asks
again at once; when it is caught up it waits `interval_s`. An unreachable archive costs
only freshness: the task retries at the next interval.

With a `path` (a remote ARCA), every mirrored stream is also appended to a local file, so a
restarted node reloads its copy from disk and resumes from the last stream it holds (the
file is the persisted cursor) instead of fetching the whole corpus again. The file keeps
about twice `max_tokens` tokens: beyond that it is rewritten with the newest `max_tokens`
(temp file and rename). A torn record at the end (a crash mid-write) is cut off on load.

Record format: magic, then per stream `<Q id><I n>` followed by n little-endian u32 tokens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from pathlib import Path
from typing import Callable, Sequence

from node.archive.client import ArchiveClient
from shared.tokens import pack_tokens, unpack_tokens

log = logging.getLogger(__name__)

MAGIC = b"REAME-L4-MIRROR\x01"
HEADER = struct.Struct("<QI")


class CorpusMirror:
    def __init__(self, archive: ArchiveClient, namespace: bytes, sink: Callable[[Sequence[int]], None], *,
                 path: Path | None = None, interval_s: float = 1.0, batch: int = 500,
                 max_tokens: int = 1_000_000) -> None:
        self.archive = archive
        self.namespace = namespace
        self.sink = sink
        self.path = path
        self.interval_s = interval_s
        self.batch = batch
        self.max_tokens = max_tokens
        self.cursor = 0
        self.streams = 0          # streams handed to the sink since start (loaded + fetched)
        self._file_tokens = 0
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()

    async def start(self) -> None:
        if self.path is not None:
            loaded = await asyncio.get_running_loop().run_in_executor(None, self._load)
            for tokens in loaded:
                self.sink(tokens)
            self.streams += len(loaded)
            if loaded:
                log.info("L4 mirror: %d streams reloaded from %s (cursor %d)", len(loaded), self.path, self.cursor)
        self._task = asyncio.create_task(self._run(), name="reame-l4-mirror")

    async def caught_up(self, timeout_s: float) -> bool:
        """Wait until one round found nothing new (tests, benches)."""
        try:
            await asyncio.wait_for(self._caught_up.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def sync(self) -> int:
        """One round: fetch what is new until a reply is not full; returns the streams fetched."""
        fetched = 0
        while True:
            reply = await self.archive.since(self.namespace, self.cursor, self.batch)
            if not reply:
                return fetched
            streams = [(sid, list(unpack_tokens(packed))) for sid, packed in reply]
            if self.path is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._append, streams)
            for _, tokens in streams:
                self.sink(tokens)
            self.cursor = max(self.cursor, streams[-1][0])
            fetched += len(streams)
            self.streams += len(streams)
            if len(reply) < self.batch:
                return fetched

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
                self._caught_up.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the mirror die: the next round retries
                log.exception("L4 mirror round failed")
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- the local copy (executor threads) --------------------------------------------------

    def _load(self) -> list[list[int]]:
        assert self.path is not None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        if not data.startswith(MAGIC):
            log.warning("L4 mirror: %s is not a mirror file; starting over", self.path)
            self.path.unlink(missing_ok=True)
            return []
        records, good = _records(data)
        if good < len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(good)
        self.cursor = max([self.cursor, *(sid for sid, _ in records)])
        self._file_tokens = sum(len(tokens) for _, tokens in records)
        return [tokens for _, tokens in _newest(records, self.max_tokens)]

    def _append(self, streams: list[tuple[int, list[int]]]) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        with open(self.path, "ab") as handle:
            if fresh:
                handle.write(MAGIC)
            for sid, tokens in streams:
                handle.write(HEADER.pack(sid, len(tokens)) + pack_tokens(tokens))
        self._file_tokens += sum(len(tokens) for _, tokens in streams)
        if self._file_tokens > 2 * self.max_tokens:
            self._compact()

    def _compact(self) -> None:
        assert self.path is not None
        records, _ = _records(self.path.read_bytes())
        kept = _newest(records, self.max_tokens) or records[-1:]  # the newest carries the cursor
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as handle:
            handle.write(MAGIC)
            for sid, tokens in kept:
                handle.write(HEADER.pack(sid, len(tokens)) + pack_tokens(tokens))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        self._file_tokens = sum(len(tokens) for _, tokens in kept)


def _records(data: bytes) -> tuple[list[tuple[int, list[int]]], int]:
    """Every complete record of a mirror file, and where the last one ends."""
    records: list[tuple[int, list[int]]] = []
    offset = len(MAGIC)
    while offset + HEADER.size <= len(data):
        sid, n = HEADER.unpack_from(data, offset)
        end = offset + HEADER.size + 4 * n
        if end > len(data):
            break
        records.append((sid, list(unpack_tokens(data[offset + HEADER.size:end]))))
        offset = end
    return records, offset


def _newest(records: list[tuple[int, list[int]]], max_tokens: int) -> list[tuple[int, list[int]]]:
    """The newest records holding at most max_tokens tokens, oldest first."""
    kept, total = [], 0
    for record in reversed(records):
        total += len(record[1])
        if total > max_tokens:
            break
        kept.append(record)
    return kept[::-1]
