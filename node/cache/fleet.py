"""The fleet tier (ARCA L3): saved states shared by every node that talks to one archive.

Before a request reaches the engine, `await prefetch(prompt_tokens)` preloads the local disk
tier into RAM and asks the archive which of the prompt's boundaries it holds (one
ARCA.KVEXISTS for the whole chain), fetches the longest one that beats what this node already
holds, verifies it and adopts it into the local RAM and disk tiers; the engine's lookup then
finds it without touching the network. After a prefill, states this node newly stored are
pushed off the request path: `max_pushes_in_flight` at once, up to `max_pushes_waiting` more
queued (beyond that dropped, counted), each tried `push_attempts` times. `flush(timeout_s)`
pushes everything stored so far (a node's graceful stop). The archive client never raises
on a down ARCA (contract 5), and every failure here is caught and counted: a down ARCA only
costs the speed-up.

Blobs travel in the disk format (node/cache/blob.py), so a node verifies what it fetches.
A state of several MB is split into parts of `part_bytes` (1 MiB), so no command monopolises
the daemon. Part 0 lives under the hex of the chained block hash and starts with b"RKVP" and
the part count; part i under "<hex>.<i>". A fetch reads part 0, then all other parts in one
pipelined round trip (`kv_get_many`), and verifies them in place (`blob.decode_parts`: the
checksum over the parts, one copy into the state). A push writes parts 1.. in one pipeline,
then part 0, so a present part 0 means all parts were written; a part evicted since is a
miss, and the reassembled blob is verified as a whole. Stage times are counted
(`fleet_fetch_seconds`, `fleet_verify_seconds`).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from node.cache import blob
from node.cache.blob import BlobError
from node.cache.prefix_cache import MB, PrefixCache

log = logging.getLogger(__name__)


class KvArchive(Protocol):
    """The part of node/archive/client.py's ArchiveClient this tier uses."""

    async def kv_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...
    async def kv_put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool: ...
    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]: ...


@dataclass(frozen=True, slots=True)
class FleetConfig:
    push: bool = True  # offer newly stored states to the archive
    fetch: bool = True  # fetch missing prefixes from the archive before prefill
    min_push_tokens: int = 0  # states shorter than this are not worth a network round trip
    max_blob_bytes: int = 256 * MB  # larger states stay local
    max_pushes_in_flight: int = 4  # pushes sending at once; more wait their turn
    max_pushes_waiting: int = 16  # beyond it, new pushes are dropped (counted)
    push_attempts: int = 3  # a push that failed (a busy or restarting archive) is tried again
    part_bytes: int = 1 << 20  # ARCA value size per part of a state


PART_MAGIC = b"RKVP"
_PART_HEADER = struct.Struct("<4sI")


def archive_key(key: bytes, part: int = 0) -> bytes:
    name = key.hex()
    return (name if part == 0 else f"{name}.{part}").encode("ascii")


def split_parts(data: bytes, part_bytes: int) -> list[bytes]:
    """The archive values holding `data`: part 0 carries the part count."""
    chunks = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]
    chunks[0] = _PART_HEADER.pack(PART_MAGIC, len(chunks)) + chunks[0]
    return chunks


def part_count(first: bytes, limit: int) -> int:
    if len(first) < _PART_HEADER.size:
        raise BlobError("archived state: part 0 too short")
    magic, count = _PART_HEADER.unpack_from(first)
    if magic != PART_MAGIC or not 1 <= count <= limit:
        raise BlobError("archived state: bad part header")
    return count


class FleetTier:
    """Connects a PrefixCache to an archive client; create it on the event loop it serves."""

    def __init__(self, cache: PrefixCache, archive: KvArchive, config: FleetConfig = FleetConfig()):
        self.cache = cache
        self.archive = archive
        self.config = config
        self._loop = asyncio.get_running_loop()
        self._pushes: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Semaphore(config.max_pushes_in_flight)
        self._offered = 0  # handed over by the writer thread, not yet started on the loop
        self._offered_lock = threading.Lock()
        self._closed = False
        if config.push:
            cache.add_stored_sink(self._offer)

    async def prefetch(self, prompt_tokens: Sequence[int], scope: str = "") -> int:
        """Bring the longest archived prefix of the prompt into the local tiers, under the
        tenant's `scope` (the archive's keys are the scoped chain's, so every node keeps it).

        Also preloads a disk-only local prefix into RAM (off the engine thread). Returns the
        tokens fetched from the archive (0: nothing better than the local tiers, or ARCA down).
        """
        await asyncio.to_thread(self.cache.preload, prompt_tokens, scope)
        if not self.config.fetch:
            return 0
        boundaries = self.cache.chain.restorable(prompt_tokens, scope)
        local = self.cache.longest_local(boundaries)
        candidates = [b for b in boundaries if b.n_tokens > local]
        if not candidates:
            return 0
        metrics = self.cache.metrics
        try:
            present = await self.archive.kv_exists([archive_key(b.key) for b in candidates])
            best = next((b for b, ok in zip(reversed(candidates), reversed(present)) if ok), None)
            if best is None:
                metrics.add(fleet_misses=1)
                return 0
            started = time.perf_counter()
            parts = await self._fetch(best.key)
            if parts is None:
                metrics.add(fleet_misses=1)
                return 0
            fetched = time.perf_counter()
            entry = await asyncio.to_thread(blob.decode_parts, parts, best.key)
            metrics.add(fleet_fetch_seconds=fetched - started, fleet_verify_seconds=time.perf_counter() - fetched)
        except BlobError as exc:
            log.warning("prefix cache: archive returned a damaged state: %s", exc)
            metrics.add(fleet_errors=1)
            return 0
        except Exception:
            log.warning("prefix cache: archive fetch failed", exc_info=True)
            metrics.add(fleet_errors=1)
            return 0
        if entry.n_tokens != best.n_tokens:
            metrics.add(fleet_errors=1)
            return 0
        self.cache.adopt(best.key, entry, publish=False)
        metrics.add(fleet_hits=1, fleet_bytes_fetched=sum(len(part) for part in parts))
        return entry.n_tokens

    async def prefetch_within(self, prompt_tokens: Sequence[int], timeout_s: float, scope: str = "") -> int:
        """`prefetch`, given up after `timeout_s`: a slow archive costs only the speed-up (the
        request then prefills what was not fetched). Counted in `fleet_timeouts`."""
        try:
            return await asyncio.wait_for(self.prefetch(prompt_tokens, scope), timeout_s)
        except asyncio.TimeoutError:
            self.cache.metrics.add(fleet_timeouts=1)
            log.info("prefix cache: prefetch gave up after %.2f s", timeout_s)
            return 0

    async def _fetch(self, key: bytes) -> list[memoryview | bytes] | None:
        """The state's parts as fetched (the blob, back to back): part 0, then every other part
        in one pipelined round trip (a request per part, each with its own deadline, once queued
        behind each other on the connections and the server and timed out under load)."""
        (first,) = await self.archive.kv_get_many([archive_key(key)])
        if first is None:
            return None
        count = part_count(first, self.config.max_blob_bytes // self.config.part_bytes + 1)
        rest = await self.archive.kv_get_many([archive_key(key, i) for i in range(1, count)])
        if any(part is None for part in rest):
            return None
        return [memoryview(first)[_PART_HEADER.size :], *(part for part in rest if part is not None)]

    async def drain(self) -> None:
        """Wait for the pushes offered so far to finish (tests, shutdown)."""
        while self._offered or self._pushes:
            if self._pushes:
                await asyncio.gather(*list(self._pushes), return_exceptions=True)
            else:
                await asyncio.sleep(0.001)

    async def flush(self, timeout_s: float) -> bool:
        """Share every state stored so far: wait for the cache's writer to hand over what it
        still holds, then for the pushes. False when `timeout_s` ran out first."""
        loop = self._loop
        deadline = loop.time() + timeout_s
        written = await asyncio.to_thread(self.cache.flush, timeout_s)
        try:
            await asyncio.wait_for(self.drain(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            return False
        return written

    @property
    def pending(self) -> int:
        """States handed over or pushing now."""
        return self._offered + len(self._pushes)

    async def close(self) -> None:
        """No new pushes; those still running are cancelled (flush first to keep them)."""
        self._closed = True
        for task in list(self._pushes):
            task.cancel()
        await asyncio.gather(*list(self._pushes), return_exceptions=True)

    # Called on the cache's writer thread.
    def _offer(self, key: bytes, n_tokens: int, header: bytes, payload: bytes) -> None:
        size = len(header) + len(payload)
        if self._closed or n_tokens < self.config.min_push_tokens or size > self.config.max_blob_bytes:
            return
        data = header + payload
        with self._offered_lock:
            self._offered += 1
        try:
            self._loop.call_soon_threadsafe(self._start_push, key, data)
        except RuntimeError:  # loop closed
            with self._offered_lock:
                self._offered -= 1

    def _start_push(self, key: bytes, data: bytes) -> None:
        with self._offered_lock:
            self._offered -= 1
        if self._closed or len(self._pushes) >= self.config.max_pushes_in_flight + self.config.max_pushes_waiting:
            self.cache.metrics.add(fleet_pushes_dropped=1)
            return
        task = self._loop.create_task(self._push(key, data))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self, key: bytes, data: bytes) -> None:
        """Parts 1.. in one pipeline, then part 0 (so a present part 0 means a whole state);
        tried again after a failure, with a pause in which a breaker the failure opened can
        close again."""
        parts = split_parts(data, self.config.part_bytes)
        rest = [(archive_key(key, index), parts[index]) for index in range(1, len(parts))]
        async with self._sending:
            for attempt in range(max(1, self.config.push_attempts)):
                if attempt:
                    await asyncio.sleep(0.5 * attempt)
                try:
                    if await self.archive.kv_put_many(rest) and \
                            await self.archive.kv_put_many([(archive_key(key), parts[0])]):
                        self.cache.metrics.add(fleet_pushes=1, fleet_bytes_pushed=len(data))
                        return
                except Exception:
                    log.warning("prefix cache: archive push failed", exc_info=True)
        log.warning("prefix cache: a state of %d bytes was not pushed to the archive", len(data))
        self.cache.metrics.add(fleet_errors=1)
