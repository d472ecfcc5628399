"""Tenants: who may see whose cached work. A tenant is the API key a request came with.

The caches that answer differently when something was seen before (L1's exact answers and
embeddings, whose hits say `X-Reame-Cache: hit` and report every prompt token as cached; the
prefix KV states, whose hits show as `cached_tokens` and in `POST /v1/warm`) are scoped by
tenant: a tenant's id goes into every L1 key and into the root of every chained block hash
(node/cache/keys.py), so two tenants sharing a prompt land on disjoint keys in every tier,
the RAM and disk tiers, the embedded archive and a shared ARCA alike, and a second node with
the same keys keeps the same scoping. A node without keys has one tenant, `OPEN` (""), whose
keys are the ones a node had before tenants existed.

A key's tenant id is a slow one-way hash of the key (PBKDF2-HMAC-SHA256, a fixed salt, so
every node derives the same id from the same key), computed once at start-up: the id never
leaves the node in the clear anyway (it is hashed again into the keys), and even a store
that leaked the derived keys would not give back a key, nor let one be guessed quickly.

`ApiKeys.tenant_of(presented)` compares what a request presents against every key in
constant time (no early exit, so the time does not tell which key nearly matched) and gives
the tenant id, or None for a wrong key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable

OPEN = ""  # the one tenant of a node that has no keys
SALT = b"reame-tenant-v1"
ROUNDS = 50_000  # about 20 ms per key on these machines, once at start-up
ID_BYTES = 16


def tenant_id(key: str) -> str:
    """The tenant id of an API key (hex; never the key, nor quick to invert)."""
    return hashlib.pbkdf2_hmac("sha256", key.encode("utf-8"), SALT, ROUNDS, ID_BYTES).hex()


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The node's keys, each with its tenant id."""

    entries: tuple[tuple[bytes, str], ...]

    @classmethod
    def of(cls, keys: Iterable[str]) -> "ApiKeys":
        unique = dict.fromkeys(key for key in keys if key)
        return cls(tuple((key.encode("utf-8"), tenant_id(key)) for key in unique))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def tenant_of(self, presented: bytes) -> str | None:
        """The tenant whose key `presented` is, or None; every key is compared, in constant time each."""
        found: str | None = None
        for key, tenant in self.entries:
            if hmac.compare_digest(presented, key):
                found = tenant
        return found
