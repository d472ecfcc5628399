"""GGUF metadata without loading the model: what autoconfiguration needs before llama.cpp runs.

Reads the key/value header of a GGUF file (memory-mapped, tensors untouched) and answers the
questions the loader asks first: the architecture, the training context and the size of one
token's KV entry, so threads, context and KV type can be chosen before the weights are read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_ARRAY_KEEP = 4096  # longer arrays (vocabularies) are skipped, not kept


class GGUFError(ValueError):
    """Not a GGUF file, or one whose header is damaged."""


@dataclass(frozen=True, slots=True)
class GGUFSummary:
    architecture: str
    name: str
    n_ctx_train: int
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    chat_template: str | None

    def kv_bytes_per_token(self, kv_type: str) -> int:
        """Upper bound of one token's K+V bytes across layers for a KV element type."""
        per_element = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}[kv_type]
        elements = self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v)
        return int(elements * per_element) + 1


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise GGUFError("truncated header")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        end = self.pos + length
        if end > len(self.data):
            raise GGUFError("truncated string")
        text = bytes(self.data[self.pos:end]).decode("utf-8", "replace")
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.unpack("<I"), self.unpack("<Q")
            if item_kind in _SCALARS and count > MAX_ARRAY_KEEP:
                self.pos += struct.calcsize(_SCALARS[item_kind]) * count
                return None
            items = [self.value(item_kind) for _ in range(count)]
            return items if count <= MAX_ARRAY_KEEP else None
        raise GGUFError(f"unknown value type {kind}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF (arrays longer than MAX_ARRAY_KEEP become None)."""
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise GGUFError(f"{path} is empty, not a GGUF model") from None
        with data:
            cursor = _Cursor(data)
            if bytes(data[:4]) != MAGIC:
                raise GGUFError(f"{path} is not a GGUF model (bad magic)")
            cursor.pos = 4
            version = cursor.unpack("<I")
            if version < 2:
                raise GGUFError(f"{path}: GGUF version {version} is too old")
            cursor.unpack("<Q")  # tensor count
            n_kv = cursor.unpack("<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cursor.string()
                meta[key] = cursor.value(cursor.unpack("<I"))
            return meta


def _int(value: Any, default: int) -> int:
    if isinstance(value, list):  # per-layer values: the largest bounds them all
        value = max((v for v in value if isinstance(v, int)), default=default)
    return int(value) if isinstance(value, (int, float)) else default


def summarize(path: Path) -> GGUFSummary:
    meta = read_metadata(path)
    arch = str(meta.get("general.architecture") or "unknown")

    def get(key: str, default: int) -> int:
        return _int(meta.get(f"{arch}.{key}"), default)

    n_head = get("attention.head_count", 1)
    n_embd = get("embedding_length", 0)
    head_dim = n_embd // n_head if n_embd and n_head else 128
    template = meta.get("tokenizer.chat_template")
    return GGUFSummary(
        architecture=arch,
        name=str(meta.get("general.name") or path.stem),
        n_ctx_train=get("context_length", 0),
        n_layer=get("block_count", 1),
        n_head_kv=get("attention.head_count_kv", n_head),
        head_dim_k=get("attention.key_length", head_dim),
        head_dim_v=get("attention.value_length", head_dim),
        chat_template=template if isinstance(template, str) else None,
    )
