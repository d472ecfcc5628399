"""Chained block keys and the saved-state blob format (table tests, no model needed)."""

from __future__ import annotations

import hashlib
import io

import pytest

from node.cache import blob
from node.cache.blob import BlobError
from node.cache.keys import BlockChain, CacheIdentity
from shared.tokens import pack_tokens

IDENTITY = CacheIdentity(model_fingerprint="ab" * 32, runtime="test")


def test_chain_follows_the_documented_formula():
    chain = BlockChain(IDENTITY, block_tokens=4)
    tokens = list(range(10))
    boundaries = chain.boundaries(tokens)
    assert [b.n_tokens for b in boundaries] == [4, 8]
    h1 = hashlib.sha256(IDENTITY.root() + pack_tokens(tokens[0:4])).digest()
    h2 = hashlib.sha256(h1 + pack_tokens(tokens[4:8])).digest()
    assert [b.key for b in boundaries] == [h1, h2]


def test_shared_prefixes_share_keys_and_diverging_blocks_do_not():
    chain = BlockChain(IDENTITY, block_tokens=4)
    a = chain.boundaries([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = chain.boundaries([1, 2, 3, 4, 5, 6, 7, 0, 9])
    assert a[0].key == b[0].key
    assert a[1].key != b[1].key


def test_restorable_leaves_at_least_one_token_to_decode():
    chain = BlockChain(IDENTITY, block_tokens=4)
    assert [b.n_tokens for b in chain.restorable(list(range(8)))] == [4]
    assert [b.n_tokens for b in chain.restorable(list(range(9)))] == [4, 8]
    assert chain.restorable([1, 2, 3]) == []


@pytest.mark.parametrize(
    "change",
    [
        {"model_fingerprint": "cd" * 32},
        {"kv_type_k": "q8_0"},
        {"kv_type_v": "q4_0"},
        {"flash_attn": True},
        {"runtime": "other build"},
        {"state_format": 99},
        {"extra": {"n_swa": "512"}},
    ],
)
def test_every_identity_field_changes_the_root(change):
    fields = dict(model_fingerprint="ab" * 32, runtime="test")
    fields.update(change)
    assert CacheIdentity(**fields).root() != IDENTITY.root()


def test_identity_requires_a_fingerprint():
    with pytest.raises(ValueError):
        CacheIdentity(model_fingerprint="")


KEY = bytes(range(32))
STATE = bytes(range(256)) * 40


@pytest.mark.parametrize("level", [None, 1])
def test_blob_round_trips_in_memory_and_from_a_file(level):
    data = blob.encode(KEY, 64, STATE, zstd_level=level)
    assert blob.decode(data, KEY) == blob.StateBlob(64, STATE)
    assert blob.read(io.BytesIO(data), KEY) == blob.StateBlob(64, STATE)
    if level is not None:
        assert len(data) < len(STATE)


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize("level", [None, 1])
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d[:-1], id="truncated-payload"),
        pytest.param(lambda d: d[:10], id="truncated-header"),
        pytest.param(lambda d: b"", id="empty"),
        pytest.param(lambda d: d + b"x", id="trailing-byte"),
        pytest.param(lambda d: _flip(d, len(d) - 5), id="payload-bit"),
        pytest.param(lambda d: _flip(d, 0), id="magic-bit"),
        pytest.param(lambda d: _flip(d, 4), id="version-bit"),
        pytest.param(lambda d: _flip(d, 8), id="n_tokens-bit"),
        pytest.param(lambda d: _flip(d, blob.HEADER_BYTES - 1), id="checksum-bit"),
    ],
)
def test_damaged_blobs_never_verify(level, damage):
    data = damage(blob.encode(KEY, 64, STATE, zstd_level=level))
    with pytest.raises(BlobError):
        blob.decode(data, KEY)
    with pytest.raises(BlobError):
        blob.read(io.BytesIO(data), KEY)
    with pytest.raises(BlobError):  # the same bytes as an archived state's parts
        blob.decode_parts(_parts(data, 1000), KEY)


def _parts(data: bytes, size: int) -> list:
    return [memoryview(data)[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("level", [None, 1])
@pytest.mark.parametrize("size", [7, 1000, blob.HEADER_BYTES, 1 << 20])
def test_blob_decodes_from_parts_in_place(level, size):
    """A blob fetched as parts (some shorter than the header) verifies without being joined
    first, and a damaged byte in any part fails it."""
    data = blob.encode(KEY, 64, STATE, zstd_level=level)
    assert blob.decode_parts(_parts(data, size), KEY) == blob.StateBlob(64, STATE)
    for index in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(BlobError):
            blob.decode_parts(_parts(_flip(data, index), size), KEY)


def test_blob_under_another_key_is_rejected():
    data = blob.encode(KEY, 64, STATE)
    with pytest.raises(BlobError, match="another key"):
        blob.decode(data, bytes(32))
