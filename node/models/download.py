"""Model downloads: stream a URL into `<file>.part`, resume with HTTP Range, verify, rename.

A cut connection is retried from where it stopped (a few times, then the `.part` file stays for
the next run to resume). The content is hashed while it streams; a known sha256 that does not
match deletes the partial file. The finished file appears under its final name only by an
atomic rename, with its fingerprint recorded beside it. Without network the error says where to
put the file by hand.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import threading
from pathlib import Path

import aiohttp
from tqdm import tqdm

from node.models.fingerprint import remember
from node.models.errors import ModelUnavailable

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
ATTEMPTS = 4
RETRY_DELAY_S = 1.0
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0


class DownloadError(ModelUnavailable):
    """A download that failed; the message says what to do next."""


class _Interrupted(Exception):
    """The transfer stopped midway; what was received is kept and resumed."""


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _hash_existing(path: Path) -> tuple[int, "hashlib._Hash"]:
    digest = hashlib.sha256()
    size = 0
    if path.exists():
        with open(path, "rb") as handle:
            while block := handle.read(CHUNK_BYTES):
                digest.update(block)
                size += len(block)
    return size, digest


def _no_network(url: str, dest: Path, reason: object) -> DownloadError:
    return DownloadError(
        f"cannot download {url} ({reason}). Without network, put the file at {dest} "
        "(or pass a path to any GGUF file) and run again"
    )


async def _transfer(session: aiohttp.ClientSession, url: str, part: Path, bar: tqdm,
                    expected_size: int | None) -> tuple[int, "hashlib._Hash"]:
    """One HTTP request: append to `part` from its current length. Returns (size, digest)."""
    offset, digest = await asyncio.to_thread(_hash_existing, part)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    async with session.get(url, headers=headers) as response:
        if response.status == 416 and offset:  # nothing left to send: the part is complete
            return offset, digest
        if response.status not in (200, 206):
            raise DownloadError(f"download of {url} failed: HTTP {response.status} {response.reason}")
        if response.status == 200 and offset:  # the server ignored Range: start over
            offset, digest = 0, hashlib.sha256()
        total = response.content_length
        total = offset + total if total is not None else expected_size
        bar.reset(total=total)
        bar.update(offset)
        mode = "ab" if offset else "wb"
        received = offset
        try:
            with open(part, mode) as handle:
                async for block in response.content.iter_chunked(CHUNK_BYTES):
                    handle.write(block)
                    digest.update(block)
                    received += len(block)
                    bar.update(len(block))
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                asyncio.TimeoutError, ConnectionResetError) as exc:
            raise _Interrupted(f"{type(exc).__name__} after {received} bytes") from None
        if total is not None and received < total:
            raise _Interrupted(f"connection closed after {received} of {total} bytes")
        return received, digest


async def download(url: str, dest: Path, *, sha256: str | None = None,
                   expected_size: int | None = None, progress: bool = True,
                   attempts: int = ATTEMPTS, retry_delay_s: float = RETRY_DELAY_S) -> Path:
    """Download `url` to `dest` (resuming `dest.part`), verify it, rename it into place."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    bar = tqdm(total=expected_size, unit="B", unit_scale=True, unit_divisor=1024,
               desc=dest.name, disable=not progress, file=sys.stderr, delay=1.0)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(1, attempts + 1):
                try:
                    size, digest = await _transfer(session, url, part, bar, expected_size)
                    break
                except _Interrupted as exc:
                    log.warning("download of %s interrupted (%s); resuming", dest.name, exc)
                    if attempt == attempts:
                        raise DownloadError(
                            f"download of {url} kept failing ({exc}); the partial file {part} "
                            "is kept: run again to resume"
                        ) from None
                    await asyncio.sleep(retry_delay_s)
                except aiohttp.ClientConnectorError as exc:
                    raise _no_network(url, dest, exc.os_error or exc) from None
                except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
                    raise _no_network(url, dest, str(exc) or type(exc).__name__) from None
                except OSError as exc:
                    raise DownloadError(f"cannot write {part}: {exc}") from None
    finally:
        bar.close()
    actual = digest.hexdigest()
    if sha256 and actual != sha256.lower():
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"download of {url} is corrupt: sha256 {actual} but expected {sha256}; "
            "the partial file was deleted, run again to retry"
        )
    os.replace(part, dest)
    remember(dest, actual)
    log.info("downloaded %s (%d bytes)", dest, size)
    return dest


def download_file(url: str, dest: Path, **options: object) -> Path:
    """Blocking form for the CLI and the loader; works whether or not a loop is running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(download(url, dest, **options))  # type: ignore[arg-type]
    outcome: dict[str, object] = {}

    def runner() -> None:
        try:
            outcome["path"] = asyncio.run(download(url, dest, **options))  # type: ignore[arg-type]
        except BaseException as exc:  # handed back to the calling thread
            outcome["error"] = exc

    thread = threading.Thread(target=runner, name="reame-download")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["path"]  # type: ignore[return-value]
