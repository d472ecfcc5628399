"""Chained block hashes: the names under which saved KV states live in every tier.

A prompt is cut into blocks of `block_tokens` tokens. The state after the first i blocks is
stored under h_i, where

    h_0 = sha256(b"reame-kv-root" || canonical identity)
    h_i = sha256(h_(i-1) || block i's tokens packed as little-endian u32)

so a key names a whole prefix (not one block in isolation) and two prompts share exactly the
keys of the blocks they share. The identity in h_0 holds everything that makes a saved state
incompatible with the context that would restore it: the model's content fingerprint (never
its path), the KV cache element types, whether V is stored transposed (flash attention off),
the llama.cpp build and the state serialisation format. A different model at the same path
therefore lands on disjoint keys and can never restore stale KV.

A tenant (node/serving/tenants.py) gets a root of its own: for a non-empty `scope`, the chain
starts at sha256(h_0 || b"reame-kv-tenant" || scope) instead of h_0, so two tenants sharing a
prompt share no key in any tier (RAM, disk, ARCA's L3), and the open tenant ("") keeps h_0.

A state that ends inside a block (a prompt's exact fork from an earlier one, node/cache/
prefix_cache.py) is named after the block boundary before it and the tokens past it:
sha256(h_i || b"reame-kv-exact" || those tokens), a name no block boundary can have.

The context size is deliberately not part of the identity: a sequence state does not depend
on it, and a snapshot that does not fit a smaller context fails to restore and falls back to
prefill.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import orjson

from shared.tokens import pack_tokens

# Bump when the meaning of a saved state changes in a way the other fields do not capture.
STATE_FORMAT = 1
DEFAULT_BLOCK_TOKENS = 32  # measured: see docs/CACHE.md
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class CacheIdentity:
    """Everything that must match for a saved sequence state to be restorable."""

    model_fingerprint: str
    kv_type_k: str = "f16"
    kv_type_v: str = "f16"
    flash_attn: bool = False
    runtime: str = ""
    state_format: int = STATE_FORMAT
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model_fingerprint:
            raise ValueError("a cache identity needs the model's content fingerprint")

    def canonical(self) -> bytes:
        return orjson.dumps(
            {
                "model": self.model_fingerprint,
                "type_k": self.kv_type_k,
                "type_v": self.kv_type_v,
                "flash_attn": self.flash_attn,
                "runtime": self.runtime,
                "state_format": self.state_format,
                "extra": {str(k): str(v) for k, v in self.extra.items()},
            },
            option=orjson.OPT_SORT_KEYS,
        )

    def root(self) -> bytes:
        return hashlib.sha256(b"reame-kv-root\0" + self.canonical()).digest()


def engine_identity(model_fingerprint: str, kv_type: str, **context: object) -> CacheIdentity:
    """The identity of an engine's context: its model, KV type, llama.cpp build, and any
    context parameter that shapes a saved state (e.g. swa_full, flash_attn)."""
    return CacheIdentity(
        model_fingerprint=model_fingerprint,
        kv_type_k=kv_type,
        kv_type_v=kv_type,
        flash_attn=bool(context.pop("flash_attn", False)),
        runtime=runtime_id(),
        extra={name: str(value) for name, value in context.items()},
    )


def runtime_id() -> str:
    """The llama.cpp build the node runs (its state format may change between builds)."""
    try:
        import llama_cpp
    except ImportError:
        return "llama-cpp-python:none"
    return f"llama-cpp-python:{getattr(llama_cpp, '__version__', 'unknown')}"


@dataclass(frozen=True, slots=True)
class Boundary:
    """A block boundary of one prompt: the first `n_tokens` tokens, named by `key`."""

    n_tokens: int
    key: bytes


class BlockChain:
    """Computes the chained keys of prompts for one identity and one block size."""

    __slots__ = ("_root", "block_tokens")

    def __init__(self, identity: CacheIdentity, block_tokens: int = DEFAULT_BLOCK_TOKENS):
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self._root = identity.root()
        self.block_tokens = block_tokens

    @property
    def root(self) -> bytes:
        return self._root

    def root_of(self, scope: str = "") -> bytes:
        """The chain's root for a tenant's scope ("" : the open tenant's, `root`)."""
        if not scope:
            return self._root
        return hashlib.sha256(self._root + b"reame-kv-tenant\0" + scope.encode("utf-8")).digest()

    def boundaries(self, tokens: Sequence[int], *, limit: int | None = None, scope: str = "") -> list[Boundary]:
        """Every full-block boundary of `tokens` with n_tokens <= limit (default len(tokens)),
        under the tenant's `scope`.

        Shortest first. Only whole blocks count: a trailing partial block has no key.
        """
        end = len(tokens) if limit is None else min(limit, len(tokens))
        out: list[Boundary] = []
        previous = self.root_of(scope)
        size = self.block_tokens
        for start in range(0, end - size + 1, size):
            digest = hashlib.sha256(previous)
            digest.update(pack_tokens(tokens[start : start + size]))
            previous = digest.digest()
            out.append(Boundary(start + size, previous))
        return out

    def exact_key(self, boundary_key: bytes, tail: Sequence[int]) -> bytes:
        """The name of the state `tail` tokens past the boundary named `boundary_key` (fewer
        than a block: a state at a block boundary has the boundary's key)."""
        return hashlib.sha256(boundary_key + b"reame-kv-exact\0" + pack_tokens(tail)).digest()

    def restorable(self, prompt_tokens: Sequence[int], scope: str = "") -> list[Boundary]:
        """Boundaries that may be restored for this prompt: at least one token must remain to
        be decoded so the engine gets logits for the prompt's last position."""
        return self.boundaries(prompt_tokens, limit=len(prompt_tokens) - 1, scope=scope)
