"""The node's one view of the archive: embedded in-process, or a remote ARCA over RESP.

Both implementations are async facades that never raise: a failure is logged, counted in
`counters` (read by /metrics) and answered like a miss, so a broken archive only removes
the speed-up. `EmbeddedArchive` runs `arca.archive.Archive` on one thread the node owns
and commits after every write (then, when one is due, takes one step of L1 log rewrite). `RemoteArchive` speaks to ARCA with redis.asyncio (hiredis
parser, a bounded pool, short timeouts) behind a circuit breaker (`node.archive.breaker`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeVar

from node.archive.breaker import Breaker
from shared.tokens import pack_tokens, unpack_tokens

if TYPE_CHECKING:
    from arca.archive import Archive, ArchiveConfig
    from node.config import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
OPERATIONS = ("ping", "get", "set", "observe", "draft", "since", "kv_get", "kv_put", "kv_exists")


class ArchiveClient(Protocol):
    counters: "ArchiveCounters"

    async def get(self, key: bytes) -> bytes | None: ...
    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None: ...
    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None: ...
    async def draft(self, ns: bytes, tail: Sequence[int], k: int) -> list[int] | None: ...
    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        """Corpus streams with id > cursor, oldest first (packed tokens); None when unreachable."""
    async def kv_get(self, key: bytes) -> bytes | None: ...
    async def kv_put(self, key: bytes, blob: bytes) -> None: ...
    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]: ...
    def state(self) -> str: ...
    async def close(self) -> None: ...


class ArchiveCounters:
    """Errors per operation, owned by one archive client and exported by /metrics."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: dict[str, int] = dict.fromkeys(OPERATIONS, 0)

    def error(self, operation: str) -> None:
        self.errors[operation] = self.errors.get(operation, 0) + 1


class EmbeddedArchive:
    """`arca.archive.Archive` in-process, every call on the node's single archive thread."""

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

    async def get(self, key: bytes) -> bytes | None:
        return await self._call("get", None, lambda arc: arc.get(key))

    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None:
        expire = None if ttl_s is None else int(time.time() * 1000) + ttl_s * 1000
        await self._call("set", None, lambda arc: arc.put(key, value, expire_at_ms=expire), writes=True)

    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None:
        packed = pack_tokens(tokens)
        await self._call("observe", None, lambda arc: arc.observe(ns, packed), writes=True)

    async def draft(self, ns: bytes, tail: Sequence[int], k: int) -> list[int] | None:
        return await self._call("draft", None, lambda arc: arc.draft(ns, list(tail), k))

    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        return await self._call("since", None, lambda arc: arc.since(ns, cursor, count))

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._call("kv_get", None, lambda arc: arc.kv_get(key))

    async def kv_put(self, key: bytes, blob: bytes) -> None:
        await self._call("kv_put", None, lambda arc: arc.kv_put(key, blob), writes=True)

    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        return await self._call("kv_exists", [False] * len(keys), lambda arc: arc.kv_exists(list(keys)))

    def state(self) -> str:
        return "embedded"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._archive.close)
        self._executor.shutdown(wait=True)


class RemoteArchive:
    """A shared ARCA over RESP: pooled, short timeouts, a circuit breaker in front."""

    def __init__(self, host: str, port: int, password: str | None = None, timeout_ms: int = 200,
                 max_connections: int = 16) -> None:
        import redis.asyncio as redis
        import redis.exceptions as redis_errors
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        timeout = timeout_ms / 1000
        self.address = f"{host}:{port}"
        self.timeout = timeout
        self.counters = ArchiveCounters()
        self.breaker = Breaker(self.address)
        pool = redis.BlockingConnectionPool(
            host=host, port=port, password=password or None, socket_timeout=timeout,
            socket_connect_timeout=timeout, max_connections=max_connections, timeout=timeout,
            retry=Retry(NoBackoff(), 0), protocol=2, client_name="reame-node",
        )
        self._redis = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        self._redis_errors = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError,
                              asyncio.TimeoutError)
        self._reply_error = redis_errors.ResponseError

    async def _call(self, operation: str, default: T, *command: Any,
                    convert: Callable[[Any], T] | None = None, probe: bool = False) -> T:
        if not (probe or self.breaker.closed):
            return default
        try:
            async with asyncio.timeout(self.timeout * 2):
                reply = await self._redis.execute_command(*command)
        except self._reply_error as exc:  # ARCA answered with an error: count it, it is up
            self.counters.error(operation)
            self.breaker.succeeded()
            log.warning("ARCA %s refused %s: %s", self.address, operation, exc)
            return default
        except self._redis_errors as exc:
            self.counters.error(operation)
            self.breaker.failed(exc)
            return default
        self.breaker.succeeded()
        return convert(reply) if convert is not None else reply

    async def ping(self) -> bool:
        """Probe ARCA (used at start and while the breaker is open)."""
        return await self._call("ping", False, "PING", convert=bool, probe=True)

    async def get(self, key: bytes) -> bytes | None:
        return await self._call("get", None, "GET", key)

    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None:
        extra = ("EX", ttl_s) if ttl_s else ()
        await self._call("set", None, "SET", key, value, *extra)

    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None:
        await self._call("observe", None, "ARCA.OBSERVE", "NS", ns, pack_tokens(tokens))

    async def draft(self, ns: bytes, tail: Sequence[int], k: int) -> list[int] | None:
        return await self._call("draft", None, "ARCA.DRAFT", "NS", ns, pack_tokens(tail), k,
                                convert=lambda reply: None if reply is None else list(unpack_tokens(reply)))

    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        return await self._call("since", None, "ARCA.SINCE", "NS", ns, cursor, "COUNT", count,
                                convert=lambda reply: [(int(sid), bytes(packed)) for sid, packed in reply])

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._call("kv_get", None, "ARCA.KVGET", key)

    async def kv_put(self, key: bytes, blob: bytes) -> None:
        await self._call("kv_put", None, "ARCA.KVPUT", key, blob)

    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        return await self._call("kv_exists", [False] * len(keys), "ARCA.KVEXISTS", *keys,
                                convert=lambda reply: [bool(flag) for flag in reply])

    def state(self) -> str:
        return "ok" if self.breaker.closed else "degraded"

    async def start(self) -> None:
        """First contact, then a watcher that probes ARCA while it is away."""
        await self.ping()
        self.breaker.start_watching(self.ping)

    async def close(self) -> None:
        await self.breaker.stop_watching()
        await self._redis.aclose()


def open_archive(settings: NodeSettings) -> ArchiveClient:
    """The archive the settings ask for: `[arca] remote` set -> RemoteArchive, else embedded.

    A RemoteArchive still needs `await archive.start()` on the event loop that will use it.
    """
    arca = settings.arca
    if arca.remote:
        host, _, port = arca.remote.rpartition(":")
        return RemoteArchive(host or "127.0.0.1", int(port), arca.password, arca.timeout_ms)
    from arca.archive import ArchiveConfig

    directory = Path(arca.directory) if arca.directory else Path(settings.home) / "arca"
    return EmbeddedArchive(ArchiveConfig(directory=directory, max_bytes=max(1, int(arca.max_mb)) * 1024 * 1024))
