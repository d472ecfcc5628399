"""A copy of a real GGUF with a chat template of the test's choosing in its metadata.

The default model ships no chat template; tests of what a template that renders tools does
(tool calls chosen by the model) need a real model file that carries one. `with_chat_template`
copies the file with `tokenizer.chat_template` set (replaced if present): the header is rewritten,
the tensor data is copied as it is, re-aligned to the file's alignment.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from pathlib import Path

from node.models.ggufmeta import MAGIC, _Cursor

KEY = "tokenizer.chat_template"
STRING = 8


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    with open(source, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert bytes(data[:4]) == MAGIC
        cursor = _Cursor(data)
        cursor.pos = 4
        version, n_tensors, n_kv = cursor.unpack("<I"), cursor.unpack("<Q"), cursor.unpack("<Q")
        pairs: list[bytes] = []
        alignment = 32
        for _ in range(n_kv):
            start = cursor.pos
            key = cursor.string()
            value = cursor.value(cursor.unpack("<I"))
            if key == "general.alignment":
                alignment = int(value)
            if key != KEY:
                pairs.append(bytes(data[start:cursor.pos]))
        pairs.append(_string(KEY) + struct.pack("<I", STRING) + _string(template))
        infos_start = cursor.pos
        for _ in range(n_tensors):
            cursor.string()
            dims = cursor.unpack("<I")
            cursor.pos += 8 * dims + 4 + 8  # dimensions, type, offset
        infos = bytes(data[infos_start:cursor.pos])
        data_start = -(-cursor.pos // alignment) * alignment
        header = MAGIC + struct.pack("<IQQ", version, n_tensors, len(pairs)) + b"".join(pairs) + infos
        padding = -len(header) % alignment
        tmp = target.with_suffix(".part")
        with open(tmp, "wb") as out:
            out.write(header + b"\0" * padding)
            out.write(data[data_start:])
    shutil.move(tmp, target)
    return target
