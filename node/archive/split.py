"""L3 on a server of its own: `[arca] kv_remote` beside `[arca] remote`.

KV states are large (megabytes each) and answers small: under one memory budget a few states
evict thousands of answers. `SplitArchive` sends the L3 operations (kv_get, kv_put,
kv_exists, kv_get_many, kv_put_many) to one remote archive and everything else (L1, L4, sessions) to the other, each
with its own breakers, so either may be down without the other; errors of both are counted
in one `counters`. `/health` is `degraded` while either is.
"""

from __future__ import annotations

from typing import Sequence

from node.archive.counters import ArchiveCounters
from node.archive.remote import RemoteArchive


class SplitArchive:
    def __init__(self, main: RemoteArchive, kv: RemoteArchive) -> None:
        self.main = main
        self.kv = kv
        self.counters = ArchiveCounters()
        main.counters = kv.counters = self.counters

    @property
    def kind(self) -> str:
        return self.main.kind

    @property
    def corpus_name(self) -> str:
        return self.main.corpus_name

    @property
    def name(self) -> str:
        return f"{self.main.name} (L3: {self.kv.name})"

    async def start(self) -> None:
        await self.main.start()
        await self.kv.start()

    async def get(self, key: bytes) -> bytes | None:
        return await self.main.get(key)

    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None:
        await self.main.set(key, value, ttl_s)

    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None:
        await self.main.observe(ns, tokens)

    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        return await self.main.since(ns, cursor, count)

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self.kv.kv_get(key)

    async def kv_put(self, key: bytes, blob: bytes) -> None:
        await self.kv.kv_put(key, blob)

    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        return await self.kv.kv_exists(keys)

    async def kv_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self.kv.kv_get_many(keys)

    async def kv_put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool:
        return await self.kv.kv_put_many(items)

    async def session_get(self, session_id: str) -> bytes | None:
        return await self.main.session_get(session_id)

    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None:
        await self.main.session_put(session_id, blob, ttl_s)

    async def session_delete(self, session_id: str) -> None:
        await self.main.session_delete(session_id)

    def state(self) -> str:
        return "ok" if self.main.state() == self.kv.state() == "ok" else "degraded"

    async def close(self) -> None:
        await self.main.close()
        await self.kv.close()
