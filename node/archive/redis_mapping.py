"""How the archive's tiers map onto plain Redis / Valkey types, when the server is not an ARCA.

Every key starts with `reame:` so the node can share a Redis with other programs.

    L1  reame:l1:<key>                   a string: SET key value PX ttl; the server's eviction
                                         (maxmemory-policy allkeys-lru) bounds the bytes
    L3  reame:l3:{<hex>}[.<i>]           a string per part of a KV state (node/cache/fleet.py
                                         splits states in parts): one hash tag per state, so
                                         all its parts live on one cluster slot; PX ttl on
                                         write, refreshed by GETEX on every read
    L4  reame:l4:{<namespace>}           one Stream per model namespace: XADD MAXLEN ~ n * t
                                         <packed tokens>; nodes mirror it with XREAD from a
                                         persisted cursor (node/archive/mirror.py)
        sessions: reame:session:{<id>}   a string holding the session's JSON, PX ttl

Stream entry ids (`<ms>-<seq>`) become the mirror's integer cursors as ms << 20 | seq (an
id of the same millisecond beyond 2^20 - 1 entries is not expected), which keep their order.
There is no server-side draft: the node drafts from its mirrored copy (the Palimpsest).
"""

from __future__ import annotations

from typing import Any

PREFIX = b"reame:"
SEQ_BITS = 20
SEQ_MASK = (1 << SEQ_BITS) - 1
TOKENS_FIELD = b"t"


def l1_key(key: bytes) -> bytes:
    return PREFIX + b"l1:" + key


def l3_key(key: bytes) -> bytes:
    """The fleet tier's `<hex>` / `<hex>.<i>` under one hash tag per state."""
    state, dot, part = key.partition(b".")
    return PREFIX + b"l3:{" + state + b"}" + (dot + part if dot else b"")


def stream_key(namespace: bytes) -> bytes:
    return PREFIX + b"l4:{" + namespace + b"}"


def session_key(session_id: str) -> bytes:
    return PREFIX + b"session:{" + session_id.encode() + b"}"


def cursor_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return (int(ms) << SEQ_BITS) | min(int(seq or 0), SEQ_MASK)


def entry_id(cursor: int) -> str:
    return f"{cursor >> SEQ_BITS}-{cursor & SEQ_MASK}"


def _fields(raw: Any) -> dict[bytes, bytes]:
    if isinstance(raw, dict):
        return {bytes(k): bytes(v) for k, v in raw.items()}
    items = list(raw or ())
    return {bytes(items[i]): bytes(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def xread_streams(reply: Any) -> list[tuple[int, bytes]]:
    """(cursor, packed tokens) of an XREAD reply for one stream, oldest first.

    redis-py hands XREAD back as [[name, [(id, fields), ...]]] (RESP2) or {name: [[...]]}."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (item[1] for item in reply)
    out: list[tuple[int, bytes]] = []
    for entries in streams:
        if entries and isinstance(entries[0], list) and entries[0] and isinstance(entries[0][0], list):
            entries = entries[0]  # RESP3 map values wrap the entry list once more
        for raw_id, raw_fields in entries or ():
            packed = _fields(raw_fields).get(TOKENS_FIELD)
            if packed is not None:
                out.append((cursor_of(raw_id), packed))
    return out
