"""The fleet tier (ARCA L3): saved states shared by every node that talks to one archive.

Before a request reaches the engine, `await prefetch(prompt_tokens)` preloads the local disk
tier into RAM and asks the archive which
of the prompt's boundaries it holds (one ARCA.KVEXISTS for the whole chain), fetches the
longest one that beats what this node already holds (ARCA.KVGET), verifies it and adopts it
into the local RAM and disk tiers; the engine's lookup then finds it without touching the
network. After a prefill, states this node newly stored are pushed (ARCA.KVPUT) off the
request path, with a bounded number in flight. The archive client never raises on a down
ARCA (contract 5), and every failure here is caught and counted: a down ARCA only costs the
speed-up.

Blobs travel in the disk format (node/cache/blob.py), so a node verifies what it fetches.
A state of several MB is split into parts of `part_bytes` (1 MiB): each ARCA command then
stays within the archive client's short timeout (a 14 MB KVPUT takes ~350 ms against a
200 ms timeout; a 1 MB part ~25 ms), and no command monopolises the daemon. Part 0 lives
under the hex of the chained block hash and starts with b"RKVP" and the part count; part i
under "<hex>.<i>". Parts are pushed last to first, so a present part 0 means all parts were
written; a part evicted since is a miss, and the reassembled blob is verified as a whole.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

from node.cache import blob
from node.cache.blob import BlobError
from node.cache.prefix_cache import MB, PrefixCache

log = logging.getLogger(__name__)


class KvArchive(Protocol):
    """The part of node/archive/client.py's ArchiveClient this tier uses."""

    async def kv_get(self, key: bytes) -> bytes | None: ...
    async def kv_put(self, key: bytes, blob: bytes) -> None: ...
    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]: ...


@dataclass(frozen=True, slots=True)
class FleetConfig:
    push: bool = True  # offer newly stored states to the archive
    fetch: bool = True  # fetch missing prefixes from the archive before prefill
    min_push_tokens: int = 0  # states shorter than this are not worth a network round trip
    max_blob_bytes: int = 256 * MB  # larger states stay local
    max_pushes_in_flight: int = 4  # beyond it, new pushes are dropped (counted)
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
            data = await self._fetch(best.key)
            if data is None:
                metrics.add(fleet_misses=1)
                return 0
            entry = await asyncio.to_thread(blob.decode, data, best.key)
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
        metrics.add(fleet_hits=1, fleet_bytes_fetched=len(data))
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

    async def _fetch(self, key: bytes) -> bytes | None:
        first = await self.archive.kv_get(archive_key(key))
        if first is None:
            return None
        count = part_count(first, self.config.max_blob_bytes // self.config.part_bytes + 1)
        rest = await asyncio.gather(*(self.archive.kv_get(archive_key(key, i)) for i in range(1, count)))
        parts = [part for part in rest if part is not None]
        if len(parts) < len(rest):
            return None
        return b"".join([first[_PART_HEADER.size :], *parts])

    async def drain(self) -> None:
        """Wait for the pushes offered so far to finish (tests, shutdown)."""
        while self._offered or self._pushes:
            if self._pushes:
                await asyncio.gather(*list(self._pushes), return_exceptions=True)
            else:
                await asyncio.sleep(0.001)

    async def close(self) -> None:
        self._closed = True
        await self.drain()

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
        if len(self._pushes) >= self.config.max_pushes_in_flight:
            self.cache.metrics.add(fleet_pushes_dropped=1)
            return
        task = self._loop.create_task(self._push(key, data))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self, key: bytes, data: bytes) -> None:
        parts = split_parts(data, self.config.part_bytes)
        try:
            for index in reversed(range(len(parts))):
                await self.archive.kv_put(archive_key(key, index), parts[index])
        except Exception:
            log.warning("prefix cache: archive push failed", exc_info=True)
            self.cache.metrics.add(fleet_errors=1)
            return
        self.cache.metrics.add(fleet_pushes=1, fleet_bytes_pushed=len(data))
