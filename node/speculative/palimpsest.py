"""The Palimpsest: a bounded in-RAM index of past generations of one model, drafted from in
microseconds.

Streams (a finished generation with the prompt tokens before it) come from this node's own
sequences as they end and from the archive mirror (node/archive/mirror.py: the fleet's
corpus through ARCA.SINCE). `add` may be called from any thread: streams wait in a queue
that the engine thread drains a bounded amount of at a time (`ingest`), so a large
mirror batch never stalls a step.

Index: a hash table from each KEY_N-gram (3 tokens) to the newest CHAIN (16) positions where
it occurred, over every stream. It is not a suffix tree: a context whose last 3-gram was
seen in more than 16 places finds only the 16 newest, and longer matches are measured, not
indexed. A proposal looks up the context's last KEY_N tokens, extends each candidate
position's match backwards token by token (up to MAX_MATCH) and keeps the longest matches;
then walks forward over those candidates: at each depth the most frequent next token (the
newest stream's on a tie) among
the candidates that still agree, stopping when the share of candidates on the path falls
under PRUNE or the draft reaches ALPHA x the match length (the draft-length rule of suffix
decoding, applied to this small candidate set). A long, often seen continuation gives a
long draft; a short or disputed one a short draft.

A replay comes first (`_replayed`): a stream that begins with the prompt's tail as streams keep
it (the last `context_tokens` prompt tokens, or the whole prompt) and goes on with everything
the sequence wrote so far is a past answer to the same prompt. Its continuation is the draft,
marked `Draft.replay`, whatever other streams holding the same text say next: a paragraph
quoted under another prompt no longer splits the vote where that quote ends, and the
controller judges replays by estimates of their own (node/speculative/controller.py).

RAM is bounded by `max_tokens`: the oldest streams are evicted with their index entries.
A stream already present (the node's own generation coming back through the mirror) is
not added twice.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
from array import array
from dataclasses import dataclass
from typing import Sequence

from node.engine.hooks import Draft, DraftSeq
from node.speculative.source import agreeing_run

log = logging.getLogger(__name__)

KEY_N = 3          # tokens in the index key
CHAIN = 16         # newest positions kept per key
MAX_MATCH = 32     # longest backward match measured
ALPHA = 4          # draft at most ALPHA x the match length
PRUNE = 0.3        # stop when the chosen path's frequency falls under this
INGEST_TOKENS = 4096  # tokens indexed per engine-thread call to ingest()


@dataclass(frozen=True, slots=True)
class PalimpsestStats:
    streams: int
    tokens: int
    pending: int
    evicted_streams: int


class Palimpsest:
    """The `archive` draft source: past generations of this model namespace."""

    name = "archive"
    cost_per_token = 0.0

    def __init__(self, max_tokens: int = 1_000_000, *, context_tokens: int = 64, min_stream: int = KEY_N + 1) -> None:
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens  # prompt tokens kept before a finished generation
        self.min_stream = min_stream
        self._streams: dict[int, array] = {}          # id -> tokens, oldest first (insertion order)
        self._index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self._digests: dict[bytes, int] = {}          # content digest -> stream id
        self._digest_of: dict[int, bytes] = {}        # stream id -> content digest
        self._pending: collections.deque[tuple[int, ...]] = collections.deque()
        self._lock = threading.Lock()                 # guards _pending only
        self._next_id = 1
        self.tokens = 0
        self.evicted = 0

    # -- feeding (any thread) -------------------------------------------------------------

    def add(self, tokens: Sequence[int]) -> None:
        if len(tokens) >= self.min_stream and len(tokens) <= self.max_tokens:
            with self._lock:
                self._pending.append(tuple(int(t) for t in tokens))

    def stats(self) -> PalimpsestStats:
        return PalimpsestStats(len(self._streams), self.tokens, len(self._pending), self.evicted)

    # -- engine thread ----------------------------------------------------------------------

    def ingest(self, budget: int = INGEST_TOKENS) -> int:
        """Index pending streams, about `budget` tokens of them; returns the tokens indexed."""
        done = 0
        while done < budget:
            with self._lock:
                if not self._pending:
                    break
                tokens = self._pending.popleft()
            done += self._index_stream(tokens)
        return done

    def _index_stream(self, tokens: tuple[int, ...]) -> int:
        digest = hashlib.blake2b(array("i", tokens).tobytes(), digest_size=16).digest()
        if digest in self._digests:
            return 0
        while self._streams and self.tokens + len(tokens) > self.max_tokens:
            self._evict_oldest()
        sid = self._next_id
        self._next_id += 1
        self._streams[sid] = array("i", tokens)
        self._digests[digest] = sid
        self._digest_of[sid] = digest
        self.tokens += len(tokens)
        index = self._index
        for pos in range(KEY_N, len(tokens)):
            key = tokens[pos - KEY_N:pos]
            chain = index.get(key)
            if chain is None:
                index[key] = [(sid, pos)]
            else:
                chain.append((sid, pos))
                if len(chain) > CHAIN:
                    del chain[0]
        return len(tokens)

    def _evict_oldest(self) -> None:
        sid = next(iter(self._streams))
        tokens = self._streams.pop(sid)
        self.tokens -= len(tokens)
        self.evicted += 1
        for pos in range(KEY_N, len(tokens)):
            key = tuple(tokens[pos - KEY_N:pos])
            chain = self._index.get(key)
            if chain is not None:
                chain[:] = [c for c in chain if c[0] != sid]
                if not chain:
                    del self._index[key]
        self._digests.pop(self._digest_of.pop(sid), None)

    def begin(self, seq: DraftSeq) -> None:
        pass

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        if k <= 0:
            return None
        chain = self._chain(context)
        window = len(context) - len(seq.prompt) + min(len(seq.prompt), self.context_tokens)
        replay = self._replayed(context, chain, window, k)
        if replay:
            return Draft(replay, self.name, match=window, replay=True)
        tokens, match = self._matched(context, chain, k)
        return Draft(tokens, self.name, match=match) if tokens else None

    def continuation(self, context: Sequence[int], k: int) -> tuple[int, ...]:
        return self.matched(context, k)[0]

    def _chain(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """The indexed positions that follow the context's last KEY_N tokens, oldest first."""
        if len(context) < KEY_N:
            return []
        return self._index.get(tuple(context[len(context) - KEY_N:]), [])

    def _replayed(self, context: Sequence[int], chain: list[tuple[int, int]], window: int,
                  k: int) -> tuple[int, ...]:
        """The next k tokens of the newest stream on `chain` that begins with the context's last
        `window` tokens (the prompt's tail that streams keep, `end`, and all the sequence wrote
        after it: a past answer to the same prompt, as far as the sequence has written it), or ()."""
        if window < KEY_N:
            return ()
        wanted: array | None = None
        for sid, pos in reversed(chain):  # newest first
            if pos != window:
                continue
            stream = self._streams[sid]
            if wanted is None:
                wanted = array("i", context[len(context) - window:])
            if stream[:pos] == wanted:
                return tuple(stream[pos:pos + k])
        return ()

    def matched(self, context: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """(the draft, the length of the context it matched). Among equally long matches the
        newest stream leads: where two past generations share the context (a greedy answer and
        a sampled one to the same prompt), the draft follows the one written last."""
        return self._matched(context, self._chain(context), k) if k > 0 else ((), 0)

    def _matched(self, context: Sequence[int], chain: list[tuple[int, int]],
                 k: int) -> tuple[tuple[int, ...], int]:
        if not chain:
            return (), 0
        streams = self._streams
        best, cands = 0, []
        for sid, pos in reversed(chain):  # newest first: max() below keeps the first of equal counts
            stream = streams[sid]
            m = agreeing_run(stream, pos, context, KEY_N, MAX_MATCH)
            if m > best:
                best, cands = m, [(stream, pos)]
            elif m == best:
                cands.append((stream, pos))
        out: list[int] = []
        weight = 1.0
        limit = min(k, ALPHA * best)
        depth = 0
        while depth < limit and cands:
            counts: dict[int, int] = {}
            for stream, pos in cands:
                if pos + depth < len(stream):
                    token = stream[pos + depth]
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token, count = max(counts.items(), key=lambda item: item[1])
            weight *= count / sum(counts.values())
            if weight < PRUNE:
                break
            out.append(token)
            cands = [(s, p) for s, p in cands if p + depth < len(s) and s[p + depth] == token]
            depth += 1
        return tuple(out), best

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        """A finished sequence of this node becomes a stream: its prompt's tail and output."""
        generated = len(tokens) - len(seq.prompt)
        if generated >= 2:
            self.add(tokens[max(0, len(seq.prompt) - self.context_tokens):])
