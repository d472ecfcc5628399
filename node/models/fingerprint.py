"""Model fingerprints: the sha256 of a GGUF's content, the model's identity in every cache key.

Hashing a multi-GB file takes seconds, so the digest is cached in a small JSON file beside the
model (`<model>.fingerprint`), valid only while the model's path, size and mtime are unchanged:
a file replaced in place gets a new fingerprint. A model directory that cannot be written just
means the hash is computed at every start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_SUFFIX = ".fingerprint"
CACHE_VERSION = 1
CHUNK_BYTES = 4 * 1024 * 1024


def cache_path(path: Path) -> Path:
    return path.with_name(path.name + CACHE_SUFFIX)


def _identity(path: Path) -> dict[str, int | str]:
    stat = path.stat()
    return {"version": CACHE_VERSION, "path": str(path.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns}


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _cached(path: Path, identity: dict[str, int | str]) -> str | None:
    try:
        record = json.loads(cache_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    digest = record.get("sha256")
    if any(record.get(key) != value for key, value in identity.items()):
        return None
    if not isinstance(digest, str) or len(digest) != 64:
        return None
    return digest


def remember(path: Path, sha256: str) -> None:
    """Record a digest already known (a verified download or assembly) for the file as it is now."""
    record = {**_identity(path), "sha256": sha256}
    target = cache_path(path)
    temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, target)
    except OSError as exc:
        log.debug("cannot cache the fingerprint of %s: %s", path, exc)
        temporary.unlink(missing_ok=True)


def model_fingerprint(path: Path) -> str:
    """Hex sha256 of the file's content, from the cache beside it when still valid."""
    path = Path(path)
    identity = _identity(path)
    cached = _cached(path, identity)
    if cached is not None:
        return cached
    log.info("fingerprinting %s (%d MB)", path.name, int(identity["size"]) // (1024 * 1024))
    digest = hash_file(path)
    if _identity(path) == identity:  # unchanged while we read it
        remember(path, digest)
    return digest
