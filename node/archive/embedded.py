"""The archive embedded in the node: `arca.archive.Archive` in-process, on one thread the node owns.

An async facade that never raises: a failure is logged, counted in `counters` (read by
/metrics) and answered like a miss, so a broken archive only removes the speed-up. Every
call runs on the node's single archive thread, which commits after every write (then, when
one is due, takes one step of L1 log rewrite). Sessions are kept by the node's own session
store in this mode (node/sessions/store.py); the session operations here exist so the
client contract is the same everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from node.archive.counters import ArchiveCounters
from shared.tokens import pack_tokens

if TYPE_CHECKING:
    from arca.archive import Archive, ArchiveConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
SESSION_PREFIX = b"reame:session:"


class EmbeddedArchive:
    """`arca.archive.Archive` in-process, every call on the node's single archive thread."""

    kind = "embedded"

    def __init__(self, config: ArchiveConfig) -> None:
        from arca.archive import Archive

        self.counters = ArchiveCounters()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reame-archive")
        self._archive = self._executor.submit(Archive, config).result()
        self._closed = False

    async def _call(self, operation: str, default: T, work: Callable[[Archive], T], *, writes: bool = False) -> T:
        if self._closed:
            return default

        def run() -> T:
            archive = self._archive
            result = work(archive)
            if writes and archive.pending_writes:
                archive.commit()
                if archive.maintenance_due():  # one slice of L1 log rewrite, a few ms
                    archive.maintenance_step()
            return result

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except Exception as exc:  # the archive failing must never fail a request
            self.counters.error(operation)
            log.warning("embedded archive %s failed: %s", operation, exc)
            return default

    async def start(self) -> None:
        pass

    async def get(self, key: bytes) -> bytes | None:
        return await self._call("get", None, lambda arc: arc.get(key))

    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None:
        expire = None if not ttl_s else int(time.time() * 1000) + ttl_s * 1000
        await self._call("set", None, lambda arc: arc.put(key, value, expire_at_ms=expire), writes=True)

    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None:
        packed = pack_tokens(tokens)
        await self._call("observe", None, lambda arc: arc.observe(ns, packed), writes=True)

    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        return await self._call("since", None, lambda arc: arc.since(ns, cursor, count))

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._call("kv_get", None, lambda arc: arc.kv_get(key))

    async def kv_put(self, key: bytes, blob: bytes) -> None:
        await self._call("kv_put", None, lambda arc: arc.kv_put(key, blob), writes=True)

    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        return await self._call("kv_exists", [False] * len(keys), lambda arc: arc.kv_exists(list(keys)))

    async def kv_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self._call("kv_get", [None] * len(keys), lambda arc: [arc.kv_get(key) for key in keys])

    async def kv_put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool:
        def put(arc: Archive) -> bool:
            for key, blob in items:
                arc.kv_put(key, blob)
            return True

        return await self._call("kv_put", False, put, writes=True)

    async def session_get(self, session_id: str) -> bytes | None:
        return await self._call("session_get", None, lambda arc: arc.get(SESSION_PREFIX + session_id.encode()))

    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None:
        await self.set(SESSION_PREFIX + session_id.encode(), blob, ttl_s)

    async def session_delete(self, session_id: str) -> None:
        await self._call("session_delete", None, lambda arc: arc.delete(SESSION_PREFIX + session_id.encode()),
                         writes=True)

    def state(self) -> str:
        return "embedded"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._archive.close)
        self._executor.shutdown(wait=True)
