"""The node's one view of the archive: the contract every archive client keeps, and the factory.

Two implementations: `EmbeddedArchive` (node/archive/embedded.py, `arca.archive.Archive`
in-process) and `RemoteArchive` (node/archive/remote.py: a shared ARCA, or a plain Redis /
Valkey, standalone or Cluster, found at connect). Both are async facades that never raise
on the answer path: a failure is logged, counted in `counters` (read by /metrics) and
answered like a miss, so a broken archive only removes the speed-up. The session
operations are the one exception (they raise `ArchiveUnavailable`).

`open_archive(settings)` picks one from `[arca] remote` (node/address.py parses it),
with L3 on a server of its own when `[arca] kv_remote` is set (node/archive/split.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from node.archive.counters import OPERATIONS, ArchiveCounters
from node.archive.embedded import EmbeddedArchive
from node.archive.remote import RedisLimits, RemoteArchive

if TYPE_CHECKING:
    from node.config import NodeSettings

__all__ = ["OPERATIONS", "ArchiveClient", "ArchiveCounters", "EmbeddedArchive", "RemoteArchive", "open_archive"]


class ArchiveClient(Protocol):
    counters: ArchiveCounters

    @property
    def kind(self) -> str:
        """"embedded", "arca", "redis", or "unknown" (a remote server not reached yet)."""

    async def start(self) -> None:
        """First contact (a remote server); call it on the event loop that will use the client."""
    async def get(self, key: bytes) -> bytes | None: ...
    async def set(self, key: bytes, value: bytes, ttl_s: int | None = None) -> None: ...
    async def observe(self, ns: bytes, tokens: Sequence[int]) -> None: ...
    async def since(self, ns: bytes, cursor: int, count: int) -> list[tuple[int, bytes]] | None:
        """Corpus streams with id > cursor, oldest first (packed tokens); None when unreachable."""
    async def kv_get(self, key: bytes) -> bytes | None: ...
    async def kv_put(self, key: bytes, blob: bytes) -> None: ...
    async def kv_exists(self, keys: Sequence[bytes]) -> list[bool]: ...
    async def kv_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The blobs under `keys` in one round trip (a state's parts); None where missing."""
    async def kv_put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool:
        """Store (key, blob) pairs in order in one round trip; True when all were taken."""
    async def session_get(self, session_id: str) -> bytes | None:
        """A stored session's bytes, None when there is none; raises ArchiveUnavailable."""
    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None:
        """Store a session for ttl_s seconds; raises ArchiveUnavailable."""
    async def session_delete(self, session_id: str) -> None: ...
    def state(self) -> str:
        """"embedded", "ok" or "degraded" (for /health)."""
    async def close(self) -> None: ...


def open_archive(settings: NodeSettings) -> ArchiveClient:
    """The archive the settings ask for: `[arca] remote` set -> RemoteArchive, else embedded.

    A RemoteArchive still needs `await archive.start()` on the event loop that will use it.
    """
    arca = settings.arca
    if arca.remote:
        from node.address import parse_address
        from node.archive.servers import TlsFiles
        from node.archive.split import SplitArchive

        def remote(url: str) -> RemoteArchive:
            return RemoteArchive(
                password=arca.password, timeout_ms=arca.timeout_ms, address=parse_address(url),
                tls=TlsFiles(arca.tls_ca_cert_file, arca.tls_cert_file, arca.tls_key_file),
                limits=RedisLimits(arca.l1_ttl_s, arca.kv_ttl_s, arca.corpus_max_streams))

        main = remote(arca.remote)
        return SplitArchive(main, remote(arca.kv_remote)) if arca.kv_remote else main
    from arca.archive import ArchiveConfig

    directory = Path(arca.directory) if arca.directory else Path(settings.home) / "arca"
    return EmbeddedArchive(ArchiveConfig(directory=directory, max_bytes=max(1, int(arca.max_mb)) * 1024 * 1024))
