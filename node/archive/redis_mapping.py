"""How the archive's tiers map onto plain Redis / Valkey types, when the server is not an ARCA.

Every key starts with `reame:` so the node can share a Redis with other programs.

    L1  reame:l1:<key>                   a string: SET key value PX ttl; the server's eviction
                                         (maxmemory-policy allkeys-lru) bounds the bytes
    L3  reame:l3:{<hex>}[.<i>]           a string per part of a KV state (node/cache/fleet.py
                                         splits states in parts): one hash tag per state, so
                                         all its parts live on one cluster slot; PX ttl on
                                         write, refreshed by GETEX on every read
    L4  reame:l4:{<namespace>}           one Stream per model namespace: XADD MAXLEN ~ n * t
                                         <packed tokens>; nodes mirror it with XRANGE from a
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


def exclusive_start(cursor: int) -> str:
    """XRANGE's start just after `cursor` (the `(` form, Redis 6.2+).

    XRANGE rather than XREAD: XREAD's keys sit after STREAMS, so a cluster client has to ask a
    node for them (COMMAND GETKEYS) and, after a failover, keeps asking the dead master; the
    key of XRANGE is always its first argument."""
    return "(" + entry_id(cursor)


def xrange_entries(reply: Any) -> list[tuple[int, bytes]]:
    """(cursor, packed tokens) of an XRANGE reply, oldest first: [[id, fields], ...]."""
    out: list[tuple[int, bytes]] = []
    for raw_id, raw_fields in reply or ():
        packed = _fields(raw_fields).get(TOKENS_FIELD)
        if packed is not None:
            out.append((cursor_of(raw_id), packed))
    return out
