"""Token streams on the wire and on disk: little-endian u32, packed in one byte string."""

from __future__ import annotations

from array import array
import sys
from typing import Iterable


class TokenPackingError(ValueError):
    """A packed token payload is malformed (length not a multiple of 4)."""


def pack_tokens(tokens: Iterable[int]) -> bytes:
    packed = array("I", tokens)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_tokens(payload: bytes) -> array:
    if len(payload) % 4:
        raise TokenPackingError(f"token payload length {len(payload)} is not a multiple of 4")
    unpacked = array("I")
    unpacked.frombytes(payload)
    if sys.byteorder != "little":
        unpacked.byteswap()
    return unpacked
