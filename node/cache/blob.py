"""The saved-state blob: one format on disk and on the wire to ARCA.

Layout (little-endian):

    magic      4s   b"RKVS"
    version    u16  FORMAT_VERSION
    flags      u16  bit 0: payload is a zstd frame
    n_tokens   u32  tokens covered by the state
    raw_len    u64  length of the state once decompressed
    payload_len u64 bytes that follow the header
    key        32s  the chained block hash the blob was stored under
    checksum   u32  zlib.crc32 over the header fields above, then the payload
    payload

The checksum is CRC-32: it guards against torn writes, truncation and bit rot (not against a
malicious writer), and at ~2.5 GB/s here it costs a few ms on a 25 MB state where BLAKE2b
costs tens. The key inside the blob catches a file renamed or fetched under the wrong name.
Anything that fails to verify raises `BlobError`; callers treat it as a miss and delete it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Sequence, Union

import zstandard

MAGIC = b"RKVS"
FORMAT_VERSION = 1
FLAG_ZSTD = 1
_FIELDS = struct.Struct("<4sHHIQQ32s")
_CHECKSUM = struct.Struct("<I")
HEADER_BYTES = _FIELDS.size + _CHECKSUM.size
# A state larger than this is certainly a damaged header (a 128k-token f16 context of a 70B
# model is still well under it).
MAX_STATE_BYTES = 64 << 30
Buffer = Union[bytes, memoryview]


class BlobError(ValueError):
    """A blob failed to verify: wrong magic or version, truncated, corrupted or misnamed."""


@dataclass(frozen=True, slots=True)
class StateBlob:
    """A verified, decompressed saved state."""

    n_tokens: int
    state: bytes


@dataclass(frozen=True, slots=True)
class _Header:
    flags: int
    n_tokens: int
    raw_len: int
    payload_len: int
    key: bytes
    checksum: int
    fields: bytes


def encode_parts(key: bytes, n_tokens: int, state: bytes, *, zstd_level: int | None = None) -> tuple[bytes, bytes]:
    """(header, payload) for a state; written back to back they form the blob.

    `zstd_level=None` stores the state as is (no copy of it is made).
    """
    if len(key) != 32:
        raise ValueError(f"blob keys are 32 bytes, got {len(key)}")
    flags = 0
    payload = state
    if zstd_level is not None:
        payload = zstandard.ZstdCompressor(level=zstd_level).compress(state)
        flags |= FLAG_ZSTD
    fields = _FIELDS.pack(MAGIC, FORMAT_VERSION, flags, n_tokens, len(state), len(payload), key)
    checksum = zlib.crc32(payload, zlib.crc32(fields))
    return fields + _CHECKSUM.pack(checksum), payload


def encode(key: bytes, n_tokens: int, state: bytes, *, zstd_level: int | None = None) -> bytes:
    header, payload = encode_parts(key, n_tokens, state, zstd_level=zstd_level)
    return header + payload


def _parse_header(header: bytes, expected_key: bytes | None) -> _Header:
    if len(header) < HEADER_BYTES:
        raise BlobError(f"truncated header ({len(header)} of {HEADER_BYTES} bytes)")
    fields = header[: _FIELDS.size]
    magic, version, flags, n_tokens, raw_len, payload_len, key = _FIELDS.unpack(fields)
    if magic != MAGIC:
        raise BlobError(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise BlobError(f"unsupported blob version {version}")
    if flags & ~FLAG_ZSTD:
        raise BlobError(f"unknown flags {flags:#x}")
    if raw_len > MAX_STATE_BYTES or payload_len > MAX_STATE_BYTES:
        raise BlobError("implausible length in header")
    if expected_key is not None and key != expected_key:
        raise BlobError("blob stored under another key")
    (checksum,) = _CHECKSUM.unpack_from(header, _FIELDS.size)
    return _Header(flags, n_tokens, raw_len, payload_len, key, checksum, fields)


def _finish(head: _Header, pieces: Sequence[Buffer]) -> StateBlob:
    """Verify the payload held in `pieces` (one buffer, or an archived state's parts in order)
    and unpack it; the checksum runs over the pieces in place, and the state is assembled
    once (a join of the pieces, or the zstd frame's output)."""
    size = sum(len(piece) for piece in pieces)
    if size != head.payload_len:
        raise BlobError(f"truncated payload ({size} of {head.payload_len} bytes)")
    checksum = zlib.crc32(head.fields)
    for piece in pieces:
        checksum = zlib.crc32(piece, checksum)
    if checksum != head.checksum:
        raise BlobError("checksum mismatch")
    whole = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
    state = whole
    if head.flags & FLAG_ZSTD:
        try:
            state = zstandard.ZstdDecompressor().decompress(whole, max_output_size=head.raw_len)
        except zstandard.ZstdError as exc:
            raise BlobError(f"zstd frame does not decode: {exc}") from None
    if len(state) != head.raw_len:
        raise BlobError(f"state is {len(state)} bytes, header says {head.raw_len}")
    return StateBlob(head.n_tokens, state)


def decode(blob: bytes, expected_key: bytes | None = None) -> StateBlob:
    """Verify and unpack a blob held in memory."""
    return decode_parts([blob], expected_key)


def decode_parts(parts: Sequence[Buffer], expected_key: bytes | None = None) -> StateBlob:
    """Verify and unpack a blob held in several buffers back to back (the parts of a state
    fetched from ARCA), without first joining them into one: that join and the payload's slice
    were two copies of the whole state, tens of ms for a 2,500-token state on a busy host."""
    views = [memoryview(part) for part in parts if len(part)]
    if not views or len(views[0]) < HEADER_BYTES:
        views = [memoryview(b"".join(views))]
    head = _parse_header(bytes(views[0][:HEADER_BYTES]), expected_key)
    size = sum(len(view) for view in views)
    if size != HEADER_BYTES + head.payload_len:
        raise BlobError(f"blob is {size} bytes, header says {HEADER_BYTES + head.payload_len}")
    return _finish(head, [views[0][HEADER_BYTES:], *views[1:]])


def read(stream: BinaryIO, expected_key: bytes | None = None) -> StateBlob:
    """Verify and unpack a blob from a file; reads the payload without an extra copy."""
    head = _parse_header(stream.read(HEADER_BYTES), expected_key)
    payload = stream.read(head.payload_len)
    if stream.read(1):
        raise BlobError("trailing bytes after payload")
    return _finish(head, [payload])

