"""L4 corpus: token streams of finished generations, per namespace, under a byte budget.

`observe` stores one stream (packed little-endian u32) and indexes it at once; the stream
is written to `corpus_streams` by the next group commit, like any write. Stream ids come
from one counter shared by all namespaces, persisted in `meta`, so they never repeat and
serve as `since` cursors. Namespaces (a model fingerprint each) never mix: each has its
own `NamespaceIndex`. The budget counts 4 bytes per stored token; when it is exceeded the
oldest streams (lowest ids, whatever their namespace) are evicted one by one, which only
advances that namespace's live window (no rebuild). At open every stream is read in id
order and each namespace is indexed in one vectorized pass.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import ArchiveConfig
from .errors import ArchiveCorruptError, ArchiveError, ArchiveOOMError
from .ngrams import TOKEN_DTYPE, NamespaceIndex

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = b"default"


class Corpus:
    def __init__(self, config: ArchiveConfig) -> None:
        self.config = config
        self.max_bytes = config.corpus_max_bytes
        self.used_bytes = 0
        self.namespaces: dict[bytes, NamespaceIndex] = {}
        self._order: deque[tuple[int, bytes]] = deque()     # (stream id, namespace), oldest first
        self._next_id = 1
        self._pending: list[tuple[int, bytes, bytes, int]] = []
        self._evicted: list[tuple[int]] = []
        self.draft_hits = self.draft_misses = self.evicted_streams = 0

    # -- writes ----------------------------------------------------------------------------

    def observe(self, namespace: bytes, packed: bytes) -> int:
        if len(packed) % 4:
            raise ArchiveError(f"token payload length {len(packed)} is not a multiple of 4")
        if not packed:
            raise ArchiveError("empty token stream")
        if len(packed) > self.max_bytes:
            raise ArchiveOOMError(f"a stream of {len(packed)} bytes exceeds the corpus budget "
                                  f"of {self.max_bytes} bytes")
        stream_id = self._next_id
        self._next_id += 1
        packed = bytes(packed)
        self._index(namespace).append(stream_id, np.frombuffer(packed, dtype=TOKEN_DTYPE))
        self._order.append((stream_id, namespace))
        self.used_bytes += len(packed)
        self._pending.append((stream_id, namespace, packed, zlib.crc32(packed)))
        while self.used_bytes > self.max_bytes:
            self._evict_oldest()
        return stream_id

    def _index(self, namespace: bytes) -> NamespaceIndex:
        index = self.namespaces.get(namespace)
        if index is None:
            index = self.namespaces[namespace] = NamespaceIndex(self.config.ngram_min, self.config.ngram_max)
        return index

    def _evict_oldest(self) -> None:
        stream_id, namespace = self._order.popleft()
        index = self.namespaces[namespace]
        self.used_bytes -= 4 * index.evict_oldest()
        if not index.ids:
            del self.namespaces[namespace]
        self._evicted.append((stream_id,))
        self.evicted_streams += 1

    # -- reads -----------------------------------------------------------------------------

    def draft(self, namespace: bytes, tail: Sequence[int], k: int) -> list[int] | None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ArchiveError("k must be a positive integer")
        if k > self.config.draft_max_k:
            raise ArchiveError(f"k must be at most {self.config.draft_max_k}")
        index = self.namespaces.get(namespace)
        found = None
        if index is not None and len(tail) >= self.config.ngram_min:
            found = index.draft(tail, k, self.config.draft_max_chain)
        if found:
            self.draft_hits += 1
            return found
        self.draft_misses += 1
        return None

    def since(self, namespace: bytes, cursor: int, count: int) -> list[tuple[int, bytes]]:
        if count < 1:
            raise ArchiveError("count must be a positive integer")
        index = self.namespaces.get(namespace)
        return [] if index is None else index.since(cursor, count)

    def stats(self) -> dict[str, int]:
        indexes = self.namespaces.values()
        return {
            "corpus_namespaces": len(self.namespaces),
            "corpus_streams": len(self._order),
            "corpus_tokens": sum(index.token_count for index in indexes),
            "corpus_ngrams": sum(index.ngram_count for index in indexes),
            "corpus_used_bytes": self.used_bytes,
            "corpus_max_bytes": self.max_bytes,
            "corpus_index_ram_bytes": sum(index.ram_bytes for index in indexes),
            "corpus_evicted_streams": self.evicted_streams,
            "draft_hits": self.draft_hits,
            "draft_misses": self.draft_misses,
        }

    # -- persistence -----------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return len(self._pending) + len(self._evicted)

    @property
    def pending_queues(self) -> tuple:
        return (self._pending, self._evicted)

    def write_pending(self, conn: sqlite3.Connection) -> None:
        if self._pending:
            conn.executemany("INSERT INTO corpus_streams (id, ns, tokens, crc) VALUES (?, ?, ?, ?)",
                             self._pending)
            conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('next_stream_id', ?)",
                         (self._next_id,))
        if self._evicted:
            conn.executemany("DELETE FROM corpus_streams WHERE id = ?", self._evicted)

    def committed(self) -> None:
        self._pending.clear()
        self._evicted.clear()

    def rolled_back(self) -> None:
        pass  # the pending streams stay pending and go with the next commit

    def load(self, conn: sqlite3.Connection, path: Path, next_id: int) -> None:
        grouped: dict[bytes, tuple[list[int], list[np.ndarray]]] = {}
        damaged, last_id = [], 0
        for stream_id, namespace, packed, crc in conn.execute(
                "SELECT id, ns, tokens, crc FROM corpus_streams ORDER BY id"):
            if zlib.crc32(packed) != crc or len(packed) % 4:
                damaged.append(stream_id)
                continue
            namespace = bytes(namespace)
            ids, streams = grouped.setdefault(namespace, ([], []))
            ids.append(stream_id)
            streams.append(np.frombuffer(packed, dtype=TOKEN_DTYPE))
            self._order.append((stream_id, namespace))
            self.used_bytes += len(packed)
            last_id = stream_id
        if damaged:
            raise ArchiveCorruptError(path, f"{len(damaged)} corpus streams fail their checksum "
                                            f"(first id {damaged[0]})")
        for namespace, (ids, streams) in grouped.items():
            self._index(namespace).append_many(ids, streams)
        self._next_id = max(next_id, last_id + 1)
        while self.used_bytes > self.max_bytes:
            self._evict_oldest()
