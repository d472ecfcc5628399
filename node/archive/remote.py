"""The remote archive: a shared ARCA, or a plain Redis / Valkey (standalone or Cluster).

One client for three kinds of server. At first contact it asks `COMMAND INFO ARCA.OBSERVE`:
an ARCA answers with the command's spec and gets the ARCA commands (ARCA.OBSERVE, ARCA.DRAFT,
ARCA.SINCE, ARCA.KV*); any other server maps the tiers onto plain Redis types
(node/archive/redis_mapping.py). A cluster address is always Redis. Until the first contact
succeeds, every call is a miss.

Like the embedded archive it never raises on the answer path: a failure is logged, counted
and answered like a miss, and the breaker of the server concerned (node/archive/servers.py)
opens, so a down server costs only the speed-up and /health says degraded. Only the session
operations raise `ArchiveUnavailable`, since a session that cannot be read is not a session
that does not exist.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

from node.archive import redis_mapping as rm
from node.address import ArchiveAddress
from node.archive.breaker import Breaker
from node.archive.counters import ArchiveCounters
from node.archive.errors import ArchiveUnavailable
from node.archive.servers import ClusterServers, SingleServer, TlsFiles, describe_failure, transport_errors
from shared.tokens import pack_tokens

log = logging.getLogger(__name__)
T = TypeVar("T")
ARCA_SESSION_PREFIX = b"reame:session:"
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class RedisLimits:
    """How long entries live in a plain Redis (seconds; 0 = until evicted) and the L4 stream's length."""

    l1_ttl_s: int = 7 * 24 * 3600
    kv_ttl_s: int = 24 * 3600
    corpus_max_streams: int = 100_000


class RemoteArchive:
    """A remote RESP server behind breakers; `kind` is "arca", "redis" or "unknown" (not reached yet)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6420, password: str | None = None,
                 timeout_ms: int = 200, max_connections: int = 16, *, address: ArchiveAddress | None = None,
                 tls: TlsFiles = TlsFiles(), limits: RedisLimits = RedisLimits()) -> None:
        if address is None:
            address = ArchiveAddress(((host, port),))
        if password and address.password is None:
            address = replace(address, password=password)
        self.address = address
        self.name = address.display()
        self.corpus_name = self.name  # where L4 lives (the mirror keeps a local copy per server)
        self.timeout = timeout_ms / 1000
        self.limits = limits
        self.counters = ArchiveCounters()
        self.kind = "redis" if address.cluster else "unknown"
        servers_class = ClusterServers if address.cluster else SingleServer
        self.servers = servers_class(address, tls, self.timeout, max_connections)
        self.servers.on_contact = self._learn_kind
        self.breaker: Breaker = self.servers.breaker  # the whole server's (a cluster: before its slot map)
        self._transport_errors = transport_errors()
        import redis.exceptions as redis_errors

        self._reply_error = redis_errors.ResponseError

    # -- first contact ----------------------------------------------------------------------

    async def _learn_kind(self) -> None:
        if self.kind != "unknown" or not isinstance(self.servers, SingleServer):
            return
        try:
            reply = await self.servers.raw("COMMAND", "INFO", "ARCA.OBSERVE")
        except self._reply_error:  # a server without COMMAND INFO is no ARCA
            reply = None
        self.kind = "arca" if isinstance(reply, list) and reply and reply[0] else "redis"
        log.info("archive %s is %s", self.name, "an ARCA" if self.kind == "arca" else
                 "a plain Redis/Valkey: L1, L3, L4 and sessions mapped onto strings and streams")

    async def start(self) -> None:
        """First contact, then watchers that probe what is away."""
        await self.ping()
        self.servers.start_watching()

    async def ping(self) -> bool:
        return await self.servers.ping()

    # -- the one call path ------------------------------------------------------------------

    async def _call(self, operation: str, default: T, *command: Any, key: bytes | None = None,
                    convert: Callable[[Any], T] | None = None, raising: bool = False) -> T:
        reply = await self._reply(operation, _UNSET, command, key, raising)
        if reply is _UNSET:
            return default
        return convert(reply) if convert is not None else reply

    async def _reply(self, operation: str, default: Any, command: Sequence[Any], key: bytes | None,
                     raising: bool) -> Any:
        breaker = self.servers.breaker_for(key)
        if not breaker.closed or self.kind == "unknown" and not await self.ping():
            if raising:
                raise ArchiveUnavailable(f"archive {self.name} is unreachable")
            return default
        try:
            reply = await asyncio.wait_for(self.servers.execute(*command), self.timeout * 2)
        except self._reply_error as exc:  # the server answered with an error: it is up
            self.counters.error(operation)
            breaker.succeeded()
            log.warning("archive %s refused %s: %s", self.name, operation, exc)
            if raising:
                raise ArchiveUnavailable(f"archive {self.name} refused {operation}: {exc}") from None
            return default
        except self._transport_errors as exc:
            self.counters.error(operation)
            reason = describe_failure(exc)
            self.servers.report(reason)
            breaker.failed(ArchiveUnavailable(reason))
            if raising:
                raise ArchiveUnavailable(f"archive {self.name} is unreachable: {reason}") from None
            return default
        breaker.succeeded()
        return reply

    @property
    def _redis(self) -> bool:
        return self.kind == "redis"

    # -- L1 ------------------------------------------------------------------------------------

    async def get(self, key: bytes) -> bytes | None:
        if self._redis:
            return await self._call("get", None, "GET", rm.l1_key(key), key=rm.l1_key(key))
        return await self._call("get", None, "GET", key, key=key)

    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None:
        if self._redis:
            ttl = ttl_s or self.limits.l1_ttl_s
            name = rm.l1_key(key)
            await self._call("set", None, "SET", name, value, *(("PX", ttl * 1000) if ttl else ()), key=name)
            return
        await self._call("set", None, "SET", key, value, *(("EX", ttl_s) if ttl_s else ()), key=key)

    # -- L4 ------------------------------------------------------------------------------------

    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None:
        if self._redis:
            stream = rm.stream_key(ns)
            await self._call("observe", None, "XADD", stream, "MAXLEN", "~", self.limits.corpus_max_streams, "*",
                             rm.TOKENS_FIELD, pack_tokens(tokens), key=stream)
            return
        await self._call("observe", None, "ARCA.OBSERVE", "NS", ns, pack_tokens(tokens))

    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        if self._redis:
            stream = rm.stream_key(ns)
            return await self._call("since", None, "XRANGE", stream, rm.exclusive_start(cursor), "+", "COUNT", count,
                                    key=stream, convert=rm.xrange_entries)
        return await self._call("since", None, "ARCA.SINCE", "NS", ns, cursor, "COUNT", count,
                                convert=lambda reply: [(int(sid), bytes(packed)) for sid, packed in reply])

    # -- L3 ------------------------------------------------------------------------------------

    def _kv_name(self, key: bytes) -> bytes:
        return rm.l3_key(key) if self._redis else key

    def _kv_get_command(self, key: bytes) -> tuple[Any, ...]:
        if not self._redis:
            return ("ARCA.KVGET", key)
        name, ttl = rm.l3_key(key), self.limits.kv_ttl_s
        return ("GETEX", name, "PX", ttl * 1000) if ttl else ("GET", name)

    def _kv_put_command(self, key: bytes, blob: bytes) -> tuple[Any, ...]:
        if not self._redis:
            return ("ARCA.KVPUT", key, blob)
        name, ttl = rm.l3_key(key), self.limits.kv_ttl_s
        return ("SET", name, blob, *(("PX", ttl * 1000) if ttl else ()))

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._call("kv_get", None, *self._kv_get_command(key), key=self._kv_name(key))

    async def kv_put(self, key: bytes, blob: bytes) -> None:
        await self._call("kv_put", None, *self._kv_put_command(key, blob), key=self._kv_name(key))

    async def kv_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The blobs under `keys` (the parts of one state) in one pipeline: one round trip
        instead of one per part. All None when the server is away."""
        if not keys:
            return []
        replies = await self._many("kv_get", [self._kv_name(k) for k in keys],
                                   [self._kv_get_command(k) for k in keys], bulk=True)
        return [None] * len(keys) if replies is None else [None if r is None else bytes(r) for r in replies]

    async def kv_put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool:
        """Store the blobs in order, in one pipeline; True when the server took every one
        (stored, or already present: L3 keys are write-once)."""
        if not items:
            return True
        replies = await self._many("kv_put", [self._kv_name(k) for k, _ in items],
                                   [self._kv_put_command(k, blob) for k, blob in items], bulk=True)
        return replies is not None

    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        missing = [False] * len(keys)
        if self._redis:
            names = [rm.l3_key(key) for key in keys]
            found = await self._many("kv_exists", names, [("EXISTS", name) for name in names])
            return missing if found is None else [bool(n) for n in found]
        return await self._call("kv_exists", missing, "ARCA.KVEXISTS", *keys,
                                convert=lambda reply: [bool(flag) for flag in reply])

    async def _many(self, operation: str, names: list[bytes], commands: list[tuple[Any, ...]], *,
                    bulk: bool = False) -> list[Any] | None:
        """The replies of `commands` on the keys `names` (one pipeline on one server; each master
        its keys on a cluster); None when a server is away or refused one. A bulk transfer (L3
        parts of 1 MiB) gets the bulk pool's longer per-reply timeout (node/archive/servers.py)
        and, as a whole, the answer-path allowance of each command, summed."""
        if self.kind == "unknown" and not await self.ping():
            return None
        breakers = {id(b): b for b in (self.servers.breaker_for(name) for name in names)}
        if not all(b.closed for b in breakers.values()):
            return None
        bound = self.timeout * 2 * (len(commands) if bulk else 1)
        try:
            return await asyncio.wait_for(self.servers.each(commands, bulk=bulk), bound)
        except self._reply_error as exc:
            self.counters.error(operation)
            log.warning("archive %s refused %s: %s", self.name, operation, exc)
            return None
        except self._transport_errors as exc:
            self.counters.error(operation)
            reason = describe_failure(exc)
            self.servers.report(reason)
            for breaker in breakers.values():
                breaker.failed(ArchiveUnavailable(reason))
            return None

    # -- sessions --------------------------------------------------------------------------

    def _session_key(self, session_id: str) -> bytes:
        return rm.session_key(session_id) if self._redis else ARCA_SESSION_PREFIX + session_id.encode()

    async def session_get(self, session_id: str) -> bytes | None:
        if self.kind == "unknown":
            await self.ping()
        name = self._session_key(session_id)
        return await self._call("session_get", None, "GET", name, key=name, raising=True)

    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None:
        if self.kind == "unknown":
            await self.ping()
        name = self._session_key(session_id)
        await self._call("session_put", None, "SET", name, blob, "PX", max(1, ttl_s) * 1000, key=name, raising=True)

    async def session_delete(self, session_id: str) -> None:
        if self.kind == "unknown":
            await self.ping()
        name = self._session_key(session_id)
        await self._call("session_delete", None, "DEL", name, key=name, raising=True)

    # -- state -------------------------------------------------------------------------------

    def state(self) -> str:
        if self.kind == "unknown":
            return "degraded"
        return self.servers.state()

    async def close(self) -> None:
        await self.servers.close()
