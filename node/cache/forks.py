"""Where prompts depart from each other, to the token: the prefix cache's exact fork points.

Block keys (node/cache/keys.py) name states at whole blocks only, so a prompt sharing 595
tokens with an earlier one restores 576 (blocks of 32) and prefills 19 tokens it shares. On a
CPU that is tens of milliseconds, paid again by every later prompt sharing the same part: the
questions on one document, the classifications under one instruction, whenever the slot that
held it has gone to another request.

So the cache remembers, for each block boundary a prompt passed, the tokens that followed it
there (the next block of the most recent TAILS prompts), and a new prompt passing the deepest
boundary it shares with an earlier one learns how far past it the two agree: its exact fork
point (`ForkIndex.observe`). The engine stores the state there as the prompt's prefill passes
it (a prefill chunk ends there), named after the boundary before it and the tokens past it
(`BlockChain.exact_key`) and indexed the same way (`add`); a later prompt with those tokens
after that boundary restores it and prefills only what is its own (`find`).

The block states this node stores are indexed the same way, under the boundary a block before
their end with that block's tokens: a prompt that departs from a stored prompt inside the
state's last block takes the state cut where they part (a classification sent again with a
new order number: the state at 64 tokens of the first, cut at the 60 they share). Only where
the cut state is whole: a sliding-window model's state holds the window before its own end, so
one of more tokens than the window (`bind_window`) is restored at its end only; with no
sliding window any state may be cut.

Exact states live in RAM only: the index that finds them is this process's, so a state that
another node or a later start could not find is worth neither a disk write nor a push to the
fleet.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from typing import Callable, Sequence

from node.cache.keys import Boundary

TAILS = 2                 # earlier prompts' next blocks remembered at each boundary
STATES_PER_BOUNDARY = 16  # states indexed under one boundary; the oldest goes first
TOKEN_BYTES = 4           # a packed token (shared/tokens.py: little-endian u32)


def prompt_digest(packed: bytes) -> bytes:
    """What tells two prompts apart (a prompt never forks from itself)."""
    return hashlib.blake2b(packed, digest_size=16).digest()


def common_tokens(a: bytes, b: bytes) -> int:
    """How many leading packed tokens a and b share."""
    return len(os.path.commonprefix([a, b])) // TOKEN_BYTES


class ForkIndex:
    """The boundaries prompts passed with the tokens after them, and the states stored, each
    under the boundary a block or less before its end. Used from the engine thread and read by
    the cache's other callers, hence the lock."""

    def __init__(self, block_tokens: int, capacity: int) -> None:
        self.block_tokens = block_tokens
        self.capacity = capacity  # boundaries remembered, and states indexed (the least recent go first)
        # boundary key -> [(prompt digest, the prompt's next block, packed)], most recent last
        self._tails: OrderedDict[bytes, list[tuple[bytes, bytes]]] = OrderedDict()
        # boundary key -> the tokens past it to a state's end, packed -> the state's key
        self._states: OrderedDict[bytes, OrderedDict[bytes, bytes]] = OrderedDict()
        self._indexed = 0  # states in `_states`
        self._lock = threading.Lock()

    def observe(self, packed: bytes, boundaries: Sequence[Boundary], limit: int) -> tuple[Boundary | None, int]:
        """Remember the prompt (`packed`: all its tokens) at each of its `boundaries`; (the
        deepest of them an earlier prompt passed too, or None; the exact fork point past it:
        where the prompt stops agreeing with the earlier prompts' tokens after it, at most
        `limit`, or 0 where it agrees with none past the boundary)."""
        digest = prompt_digest(packed)
        size = self.block_tokens * TOKEN_BYTES
        deepest: Boundary | None = None
        fork = 0
        with self._lock:
            for boundary in reversed(boundaries):
                tails = self._tails.get(boundary.key)
                if tails is None:
                    continue
                deepest = boundary
                start = boundary.n_tokens * TOKEN_BYTES
                mine = packed[start:start + size]
                agree = max((common_tokens(mine, tail) for other, tail in tails if other != digest), default=0)
                fork = min(boundary.n_tokens + agree, limit) if agree else 0
                break
            for boundary in boundaries:
                start = boundary.n_tokens * TOKEN_BYTES
                tails = [(d, t) for d, t in self._tails.pop(boundary.key, []) if d != digest]
                self._tails[boundary.key] = [*tails[-(TAILS - 1):], (digest, packed[start:start + size])]
            while len(self._tails) > self.capacity:
                self._tails.popitem(last=False)
        return deepest, fork if deepest is not None and fork > deepest.n_tokens else 0

    def add(self, boundary_key: bytes, tail: bytes, key: bytes) -> None:
        """Index the state `key` holding a prompt up to `tail` (packed tokens, at most a block)
        past the boundary named `boundary_key`."""
        with self._lock:
            states = self._states.pop(boundary_key, None) or OrderedDict()
            self._indexed -= len(states)
            states.pop(tail, None)
            states[tail] = key
            while len(states) > STATES_PER_BOUNDARY:
                states.popitem(last=False)
            self._states[boundary_key] = states
            self._indexed += len(states)
            while self._indexed > self.capacity:  # the boundary indexed least recently goes, with its states
                _, gone = self._states.popitem(last=False)
                self._indexed -= len(gone)

    def __len__(self) -> int:
        """States indexed."""
        with self._lock:
            return self._indexed

    def find(self, packed: bytes, boundaries: Sequence[Boundary], floor: int, limit: int,
             held: Callable[[bytes], bool], window: int | None = None) -> tuple[int, bytes] | None:
        """The indexed state holding the most of the prompt (`packed`), more than `floor` tokens
        and at most `limit`, that `held(key)` still finds: (the prompt's tokens it holds, its
        key). A state holding tokens past those the prompt shares with it counts only where it
        may be cut: `window` 0, or its tokens within `window` (None: no state is cut)."""
        for n, key in self._candidates(packed, boundaries, floor, limit, window):
            if held(key):
                return n, key
        return None

    def _candidates(self, packed: bytes, boundaries: Sequence[Boundary], floor: int, limit: int,
                    window: int | None) -> list[tuple[int, bytes]]:
        """What each indexed state sharing more than `floor` tokens holds of the prompt, most first."""
        found: list[tuple[int, bytes]] = []
        with self._lock:
            for boundary in reversed(boundaries):
                if boundary.n_tokens + self.block_tokens <= floor:
                    break  # a state indexed here ends within the next block
                states = self._states.get(boundary.key)
                if not states:
                    continue
                start = boundary.n_tokens * TOKEN_BYTES
                for tail, key in states.items():
                    end = boundary.n_tokens + len(tail) // TOKEN_BYTES  # the state's tokens
                    mine = packed[start:start + len(tail)]
                    shared = end if mine == tail else boundary.n_tokens + common_tokens(mine, tail)
                    n = min(shared, limit)
                    if n < end and (window is None or 0 < window < end):
                        continue  # it would need a cut, which would leave its window incomplete
                    if n > floor and n > boundary.n_tokens:
                        found.append((n, key))
        return sorted(found, key=lambda item: -item[0])
