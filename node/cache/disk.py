"""The disk tier: one verified blob file per saved state, an LRU byte budget, no index.

Layout under the cache directory:

    kv/<key hex>.kvs     one blob (node/cache/blob.py) per chained block hash
    tmp/                 blobs being written (temp file, then a no-replace link into kv/)
    evict.lock           fcntl lock held while making room and publishing a new entry

There is no index file to corrupt or to keep in step: the directory listing is the index and
each file's mtime is its last use (touched on every hit), so entries survive restarts and two
processes can share one directory. Publishing uses `os.link`, which fails if the entry
exists, so an entry is never rewritten; readers never lock (a file unlinked while being read
stays readable through the open descriptor; a file that vanishes is a miss). Writers take the
lock, list the directory, drop the least recently used files until the new entry fits, then
publish, so the budget holds across every process sharing the directory.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from node.cache import blob
from node.cache.blob import BlobError, StateBlob

log = logging.getLogger(__name__)

SUFFIX = ".kvs"
STALE_TEMP_S = 600.0
# A blob goes to its file in writes of this size. One write() of a 15.5 MB state cost 160-280 ms
# of system time on an ext4 volume of a KVM guest (1 MiB writes: 6 ms for the lot), a core
# taken from llama.cpp's threads while they decode: a 28-token step beside it ran 3x slower.
WRITE_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class DiskUsage:
    files: int
    bytes: int


class DiskTier:
    """Saved states as files under `directory`, at most `budget_bytes` in total."""

    def __init__(self, directory: Path, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"disk budget must be >= 0, got {budget_bytes}")
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self._entries = self.directory / "kv"
        self._temp = self.directory / "tmp"
        self._entries.mkdir(parents=True, exist_ok=True)
        self._temp.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.directory / "evict.lock"
        self._thread_lock = threading.Lock()  # flock is per open file; serialise our threads
        self.corrupt_deleted = 0
        self.evicted_bytes = 0
        self.evictions = 0
        self.bytes_written = 0
        self._remove_stale_temp_files()

    def path_for(self, key: bytes) -> Path:
        return self._entries / (key.hex() + SUFFIX)

    def contains(self, key: bytes) -> bool:
        return self.path_for(key).exists()

    def get(self, key: bytes) -> StateBlob | None:
        """The verified state under `key`, or None; a blob that fails to verify is deleted."""
        path = self.path_for(key)
        try:
            with open(path, "rb") as stream:
                entry = blob.read(stream, expected_key=key)
        except FileNotFoundError:
            return None
        except BlobError as exc:
            log.warning("prefix cache: deleting damaged entry %s: %s", path.name, exc)
            self.corrupt_deleted += 1
            _unlink_quietly(path)
            return None
        except OSError as exc:
            log.warning("prefix cache: cannot read %s: %s", path.name, exc)
            return None
        try:
            os.utime(path)  # mtime is the LRU clock
        except OSError:
            pass
        return entry

    def put(self, key: bytes, header: bytes, payload: bytes) -> int:
        """Publish an encoded blob (`blob.encode_parts`) as a new entry.

        Returns the bytes written; 0 when the entry exists already or exceeds the budget.
        """
        path = self.path_for(key)
        if path.exists():
            return 0
        size = len(header) + len(payload)
        if size > self.budget_bytes:
            return 0
        temp = self._temp / f"{key.hex()}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        with self._exclusive():
            if path.exists():
                return 0
            self._make_room(size)
            try:
                with open(temp, "wb") as stream:
                    stream.write(header)
                    view = memoryview(payload)
                    for start in range(0, len(view), WRITE_CHUNK):
                        stream.write(view[start:start + WRITE_CHUNK])
                published = _publish(temp, path)
            finally:
                _unlink_quietly(temp)
        if published:
            self.bytes_written += size
        return size if published else 0

    def discard(self, key: bytes) -> None:
        _unlink_quietly(self.path_for(key))

    def usage(self) -> DiskUsage:
        entries = self._scan()
        return DiskUsage(len(entries), sum(size for _, size, _ in entries))

    def _make_room(self, incoming: int) -> None:
        entries = self._scan()
        total = sum(size for _, size, _ in entries)
        entries.sort(key=lambda item: item[2])  # oldest use first
        for path, size, _ in entries:
            if total + incoming <= self.budget_bytes:
                break
            if _unlink_quietly(path):
                self.evictions += 1
                self.evicted_bytes += size
            total -= size

    def _scan(self) -> list[tuple[Path, int, float]]:
        found = []
        try:
            with os.scandir(self._entries) as listing:
                for item in listing:
                    if not item.name.endswith(SUFFIX):
                        continue
                    try:
                        info = item.stat()
                    except FileNotFoundError:
                        continue
                    found.append((Path(item.path), info.st_size, info.st_mtime))
        except FileNotFoundError:
            self._entries.mkdir(parents=True, exist_ok=True)
        return found

    def _exclusive(self) -> "_DirectoryLock":
        return _DirectoryLock(self._lock_path, self._thread_lock)

    def _remove_stale_temp_files(self) -> None:
        cutoff = time.time() - STALE_TEMP_S
        with os.scandir(self._temp) as listing:
            for item in listing:
                try:
                    if item.stat().st_mtime < cutoff:
                        _unlink_quietly(Path(item.path))
                except FileNotFoundError:
                    continue


class _DirectoryLock:
    """Exclusive across processes (fcntl on a lock file) and across this process's threads."""

    def __init__(self, path: Path, thread_lock: threading.Lock):
        self._path = path
        self._thread_lock = thread_lock
        self._fd = -1

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            self._thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        finally:
            self._thread_lock.release()


def _publish(temp: Path, path: Path) -> bool:
    """Make `temp` visible as `path` unless `path` exists; never replaces an entry."""
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        # Filesystems without hard links: rename is still atomic; under the directory lock
        # the existence check above makes a replace impossible between our own writers.
        if path.exists():
            return False
        os.replace(temp, path)
        return True


def _unlink_quietly(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
