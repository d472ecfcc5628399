"""The prefix KV cache the engine consults: RAM and disk tiers behind the engine's hook.

The engine calls `lookup`, `boundaries_to_store` and `store` on its own thread
(contract: node/engine/hooks.py `PrefixCacheHook`), each with the request's tenant scope
(node/cache/keys.py: a tenant's states live under keys of its own). Lookups walk the prompt's block
boundaries longest first, RAM then disk; the ARCA tier (node/cache/fleet.py) is fetched into
RAM before the request reaches the engine, so the engine thread never waits on the network,
and `preload` moves a disk-only prefix into RAM at the same moment, off the engine thread.
`store` only puts the state in RAM and enqueues it; a writer thread the cache owns encodes
it, offers it to the fleet pusher, then publishes it on disk. A state adopted from the fleet
goes to disk through a second writer at the lowest priority, since nobody waits for it.

What is stored (each boundary at most once, never rewritten), for a prompt P:
  - the last boundary of P, so a conversation that extends P (the next turn) restores all
    of it;
  - the fork point: the longest boundary of P that an earlier prompt also had, i.e. where
    P departs from something already seen (the end of a shared document before the
    question), so every later prompt sharing that document restores up to there;
  - a checkpoint every `checkpoint_tokens` tokens, so long shared prefixes that have not
    forked yet are still partly reusable;
and of those only the ones at least `min_gain_tokens` beyond the longest prefix of P already
stored (a question's own tail a few tokens past a stored document is not worth a snapshot).
Every other boundary only has its key computed. A state saved at n tokens holds the whole
prefix (per-sequence state), so snapshots are not stacked per block.

Besides, the exact fork point: where P stops agreeing with an earlier prompt past the deepest
boundary they share (node/cache/forks.py), at least `exact_min_gain_tokens` beyond what is
stored for P. It is the point every later prompt sharing that part restores to the token; its
state lives in RAM only.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from node.cache import blob
from node.cache.blob import StateBlob
from node.cache.disk import DiskTier
from node.cache.forks import ForkIndex
from node.cache.keys import DEFAULT_BLOCK_TOKENS, BlockChain, Boundary, CacheIdentity
from node.cache.metrics import CacheMetrics
from node.cache.ram import RamTier
from shared.tokens import pack_tokens

if TYPE_CHECKING:
    from node.config import CacheSettings

log = logging.getLogger(__name__)

MB = 1 << 20
# Receives (key, n_tokens, encoded blob parts) of each state newly written by this node.
StoredSink = Callable[[bytes, int, bytes, bytes], None]


LOCAL_WRITER_NICE = 19  # the local writer's niceness: its disk writes take only CPU the engine leaves


def _yield_to_the_engine() -> None:
    """Lower the calling thread's priority to LOCAL_WRITER_NICE (Linux gives each thread its own
    nice value). A state written while a request decodes takes CPU from the step's threads: a
    2,464-token state fetched from ARCA was written to disk during its question's prefill, which
    took 28-44 ms where it takes 20-22 alone. Only states nobody waits for get this thread: at
    nice 19 on a busy host a state's push to the fleet waited seconds. Elsewhere the call fails
    and the thread keeps its priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOCAL_WRITER_NICE)
    except (AttributeError, OSError):
        log.debug("prefix cache: the writer keeps the process's priority")


@dataclass(frozen=True, slots=True)
class PrefixCacheConfig:
    directory: Path | None = None  # None: RAM tier only
    ram_bytes: int = 256 * MB
    disk_bytes: int = 512 * MB
    compress: bool = False
    zstd_level: int = 1
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    checkpoint_tokens: int = 1024  # 0: no periodic checkpoints
    store_prompt_tail: bool = True
    min_gain_tokens: int = 64  # a snapshot must save at least this much prefill
    write_queue: int = 16  # states waiting for each writer (the fleet's, the local disk's); beyond it, RAM only
    seen_keys: int = 16384  # boundary keys remembered to find fork points
    exact_min_gain_tokens: int = 16  # an exact fork state must save this much prefill (0: none stored)

    @classmethod
    def from_settings(cls, cache: CacheSettings, **overrides: Any) -> "PrefixCacheConfig":
        """From the node's `[cache]` settings section (enabled, directory, ram_mb,
        max_size_mb, compress, block_tokens)."""
        values: dict[str, Any] = dict(
            directory=Path(cache.directory).expanduser() if cache.directory else None,
            ram_bytes=int(cache.ram_mb) * MB,
            disk_bytes=int(cache.max_size_mb) * MB,
            compress=bool(cache.compress),
            block_tokens=int(cache.block_tokens),
        )
        values.update(overrides)
        return cls(**values)


class PrefixCache:
    """Implements the engine's PrefixCacheHook over a RAM tier and an optional disk tier."""

    def __init__(self, identity: CacheIdentity, config: PrefixCacheConfig = PrefixCacheConfig()):
        self.identity = identity
        self.config = config
        self.chain = BlockChain(identity, config.block_tokens)
        self.metrics = CacheMetrics()
        self.ram = RamTier(config.ram_bytes)
        self.disk = DiskTier(config.directory, config.disk_bytes) if config.directory else None
        self.forks = ForkIndex(config.block_tokens, config.seen_keys)
        self.window: int | None = None  # the model's sliding window (`bind_window`); None: no state is cut
        self._pending: set[bytes] = set()
        self._lock = threading.Lock()
        self._sinks: list[StoredSink] = []
        # two writers: states this node computed (offered to the fleet, then written to disk) at
        # the process's priority; states it adopted (fetched from the fleet: the disk alone) below it
        self._queue: queue.Queue[tuple[bytes, StateBlob, bool] | None] = queue.Queue(config.write_queue)
        self._local_queue: queue.Queue[tuple[bytes, StateBlob, bool] | None] = queue.Queue(config.write_queue)
        self._writer = threading.Thread(target=self._write_loop, args=(self._queue, False),
                                        name="prefix-cache-writer", daemon=True)
        self._local_writer = threading.Thread(target=self._write_loop, args=(self._local_queue, True),
                                              name="prefix-cache-local-writer", daemon=True)
        self._closed = False
        self._writer.start()
        self._local_writer.start()

    # ----------------------------------------------------------------- engine hook

    def bind_window(self, n_swa: int) -> None:
        """The engine's model keeps a sliding window of `n_swa` tokens (0: none): a state of more
        tokens holds only the window before its own end, so it is never restored cut short."""
        self.window = max(0, int(n_swa))

    def lookup(self, prompt_tokens: Sequence[int], scope: str = "", beyond: int = 0) -> tuple[int, bytes] | None:
        started = time.perf_counter()
        boundaries = self.chain.restorable(prompt_tokens, scope)
        found = self._find([b for b in boundaries if b.n_tokens > beyond])
        exact = self._find_exact(prompt_tokens, boundaries, max(beyond, found[0].n_tokens if found else 0))
        restored = exact[0] if exact is not None else found[0].n_tokens if found else 0
        deltas: dict[str, float] = dict(
            lookups=1, tokens_restored=restored, tokens_prefilled=len(prompt_tokens) - max(restored, beyond)
        )
        if exact is not None:
            deltas.update(ram_hits=1, exact_hits=1)
        elif found is None:
            deltas.update(ram_misses=1, disk_misses=1 if self.disk else 0)
        elif found[1] == "ram":
            deltas.update(ram_hits=1)
        else:
            deltas.update(ram_misses=1, disk_hits=1)
        if exact is not None or found is not None:
            deltas["restore_seconds"] = time.perf_counter() - started
        self.metrics.add(**deltas)
        if exact is not None:
            return exact[0], exact[1].state
        return (found[0].n_tokens, found[2].state) if found is not None else None

    def boundaries_to_store(self, prompt_tokens: Sequence[int], scope: str = "") -> list[int]:
        boundaries = self.chain.restorable(prompt_tokens, scope)
        if not boundaries:
            return []
        chosen: dict[bytes, Boundary] = {}
        if self.config.store_prompt_tail:
            chosen[boundaries[-1].key] = boundaries[-1]
        every = self.config.checkpoint_tokens
        if every > 0:
            for boundary in boundaries:
                if boundary.n_tokens % every == 0:
                    chosen[boundary.key] = boundary
        packed = pack_tokens(prompt_tokens)
        fork, exact = self.forks.observe(packed, boundaries, len(prompt_tokens) - 1)
        if fork is not None:
            chosen[fork.key] = fork
        # Each snapshot must save at least `min_gain_tokens` of prefill over the longest
        # prefix of this prompt already stored (or chosen below it): re-prefilling a few
        # tokens is cheaper than saving and writing megabytes that are rarely reused.
        base = self.longest_local(boundaries)
        wanted = []
        for boundary in sorted(chosen.values(), key=lambda b: b.n_tokens):
            if boundary.n_tokens - base >= max(self.config.min_gain_tokens, 1):
                wanted.append(boundary.n_tokens)
                base = boundary.n_tokens
        # the exact fork: a later prompt sharing this part restores it to the token, so the bar
        # is lower (`exact_min_gain_tokens`), over what is stored or chosen for this prompt
        gain = self.config.exact_min_gain_tokens
        if exact and gain > 0:
            below = [b for b in boundaries if b.n_tokens < exact]
            held = self.forks.find(packed, below, 0, exact, self.ram.contains, self.window)
            have = max([n for n in wanted if n < exact] + [self.longest_local(below), held[0] if held else 0])
            if exact - have >= gain:
                wanted = sorted([*wanted, exact])
        return wanted

    def store(self, prompt_tokens: Sequence[int], n_tokens: int, state: bytes, scope: str = "") -> None:
        """Keep the state in RAM at once; the disk write and fleet push happen later."""
        block = self.chain.block_tokens
        if n_tokens < block or n_tokens > len(prompt_tokens):
            log.warning("prefix cache: ignoring a state at %d tokens (not past a block boundary)", n_tokens)
            return
        chain = self.chain.boundaries(prompt_tokens, limit=n_tokens, scope=scope)
        boundary = chain[-1]
        if boundary.n_tokens == n_tokens:
            self.adopt(boundary.key, StateBlob(n_tokens, bytes(state)), publish=True)
            if len(chain) > 1:  # indexed by its last block, to be cut where a prompt parts from it
                before = chain[-2]
                self.forks.add(before.key, pack_tokens(prompt_tokens[before.n_tokens:n_tokens]), boundary.key)
            return
        tail = prompt_tokens[boundary.n_tokens:n_tokens]  # an exact fork: RAM only (node/cache/forks.py)
        key = self.chain.exact_key(boundary.key, tail)
        entry = StateBlob(n_tokens, bytes(state))
        if self.ram.put(key, entry):
            self.forks.add(boundary.key, pack_tokens(tail), key)
            self.metrics.add(stores=1, exact_stores=1, bytes_stored_ram=len(entry.state))

    # ----------------------------------------------------------------- other tiers

    def adopt(self, key: bytes, entry: StateBlob, *, publish: bool) -> None:
        """Take a state into RAM and queue it for disk (and, when `publish`, for the fleet)."""
        if self.ram.put(key, entry):
            self.metrics.add(bytes_stored_ram=len(entry.state))
        self.metrics.add(stores=1)
        if self.disk is None and not (publish and self._sinks):
            return
        with self._lock:
            if key in self._pending or self._closed:
                return
            self._pending.add(key)
        try:
            (self._queue if publish else self._local_queue).put_nowait((key, entry, publish))
        except queue.Full:
            with self._lock:
                self._pending.discard(key)
            self.metrics.add(stores_dropped=1)

    def add_stored_sink(self, sink: StoredSink) -> None:
        """Call `sink` on the writer thread for each state this node newly stores."""
        self._sinks.append(sink)

    def preload(self, prompt_tokens: Sequence[int], scope: str = "") -> int:
        """Read the prompt's longest disk-only prefix into RAM ahead of the request, so the
        engine thread's lookup is a RAM hit instead of a file read that stalls every other
        user's step. Returns the tokens preloaded (0: RAM already holds the best, or none).
        Blocking: call it through asyncio.to_thread."""
        if self.disk is None:
            return 0
        for boundary in reversed(self.chain.restorable(prompt_tokens, scope)):
            if self.ram.contains(boundary.key):
                return 0
            entry = self.disk.get(boundary.key) if self.disk.contains(boundary.key) else None
            if entry is not None:
                self.ram.put(boundary.key, entry)
                self.metrics.add(disk_preloads=1)
                return boundary.n_tokens
        return 0

    def longest_local(self, boundaries: Sequence[Boundary]) -> int:
        """The longest of `boundaries` held in RAM or on disk (0 when none), unverified."""
        for boundary in reversed(boundaries):
            if self._is_stored(boundary.key):
                return boundary.n_tokens
        return 0

    @property
    def pending(self) -> int:
        """States queued for the writer (disk, fleet) and not written yet."""
        with self._lock:
            return len(self._pending)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until queued states are written; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return True
            time.sleep(0.005)
        return False

    def stats(self) -> dict[str, float]:
        out = self.metrics.snapshot()
        out.update(ram_bytes=self.ram.used_bytes, ram_entries=len(self.ram),
                   ram_evicted_bytes=self.ram.evicted_bytes, ram_evictions=self.ram.evictions)
        if self.disk is not None:
            usage = self.disk.usage()
            out.update(disk_bytes=usage.bytes, disk_entries=usage.files,
                       disk_evicted_bytes=self.disk.evicted_bytes, disk_evictions=self.disk.evictions,
                       disk_corrupt_deleted=self.disk.corrupt_deleted)
        return out

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the writer threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._local_queue.put(None)
        deadline = time.monotonic() + timeout
        self._writer.join(timeout)
        self._local_writer.join(max(0.0, deadline - time.monotonic()))

    # ----------------------------------------------------------------- internals

    def _find(self, boundaries: Sequence[Boundary]) -> tuple[Boundary, str, StateBlob] | None:
        for boundary in reversed(boundaries):
            entry = self.ram.get(boundary.key)
            if entry is not None:
                return boundary, "ram", entry
            if self.disk is not None:
                entry = self.disk.get(boundary.key)
                if entry is not None:
                    self.ram.put(boundary.key, entry)
                    return boundary, "disk", entry
        return None

    def _find_exact(self, prompt_tokens: Sequence[int], boundaries: Sequence[Boundary],
                    floor: int) -> tuple[int, StateBlob] | None:
        """The RAM state holding the most of the prompt past `floor` tokens to the token (an exact
        fork state, or a state the prompt parts from inside its last block, to be cut there):
        (the prompt's tokens it holds, the state)."""
        found = self.forks.find(pack_tokens(prompt_tokens), boundaries, floor, len(prompt_tokens) - 1,
                                self.ram.contains, self.window)
        entry = self.ram.get(found[1]) if found is not None else None
        return (found[0], entry) if entry is not None and found is not None and entry.n_tokens >= found[0] else None

    def _is_stored(self, key: bytes) -> bool:
        if self.ram.contains(key) or key in self._pending:
            return True
        return self.disk is not None and self.disk.contains(key)

    def _write_loop(self, items: "queue.Queue[tuple[bytes, StateBlob, bool] | None]", local: bool) -> None:
        if local:
            _yield_to_the_engine()
        while True:
            item = items.get()
            if item is None:
                return
            key, entry, publish = item
            try:
                self._write(key, entry, publish)
            except Exception:  # a full disk must not end the writer
                log.exception("prefix cache: storing a state failed")
                self.metrics.add(disk_write_errors=1)
            finally:
                with self._lock:
                    self._pending.discard(key)

    def _write(self, key: bytes, entry: StateBlob, publish: bool) -> None:
        level = self.config.zstd_level if self.config.compress else None
        header, payload = blob.encode_parts(key, entry.n_tokens, entry.state, zstd_level=level)
        if publish:  # the fleet first: another node may be about to ask for this prefix
            for sink in self._sinks:
                sink(key, entry.n_tokens, header, payload)
        if self.disk is not None:
            written = self.disk.put(key, header, payload)
            self.metrics.add(bytes_stored_disk=written)
