"""Constrained output: grammars compiled once by llguidance, checked token by token.

llguidance was chosen by measurement at Gemma's 262,144-token vocabulary (bench/structure.py,
docs/BENCHMARKS.md): checking one sampled token costs a few microseconds, a whole-vocabulary
mask tens of microseconds at the median, and it computes the tokens a grammar forces (the
drafts of Il Suggeritore, node/speculative/format.py). llama.cpp's own grammar sampler
judges every token it is handed and costs milliseconds over the whole vocabulary.

- `GrammarCompiler` (one per engine): the model's vocabulary as llguidance sees it, built on
  first use (about 5 s at 262,144 tokens, never on the engine thread), and an LRU of compiled
  grammars keyed by the sha256 of the spec, bounded by count and by bytes (each grammar's
  memory measured as it compiles), so each distinct schema compiles once. A spec that does
  not compile, or fails within its first masks (`_probe`), raises `InvalidRequest` with
  llguidance's reason cut short (an unsupported JSON Schema keyword is named there), and is
  never cached. Every compile runs under node/engine/grammar_limits.py's limits.
- `Matcher` (one per sequence, a copy of the compiled grammar's initial state): `allows`
  checks one token, `masked` applies the whole mask to a row of logits, `accept` advances,
  `forced` lists the tokens the grammar forces in its own (canonical) tokenization, `only`
  the next token when no logits can change it: the first forced token (sampling takes it
  wherever bytes are forced, node/engine/sampling.py), or an end-of-generation token once
  the output is complete and the mask admits nothing else (the engine's jump-forward,
  node/engine/scheduler.py).

Every end-of-generation token of the model counts as the grammar's end: once the output is
complete, only they are allowed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Iterable, Sequence

import numpy as np

import llama_cpp as ll

from node.engine.errors import InvalidRequest
from node.engine.grammar_limits import parser_limits, short_error
from node.engine.types import GrammarSpec

CACHE_SIZE = 64  # compiled grammars kept per engine
CACHE_BYTES = 256 * 2**20  # and the memory they may hold (estimated per grammar: `_footprint`)
PROBE_STEPS = 4  # masks computed at compile time along one path, so a grammar that fails as generation starts fails here
# Compact JSON (no free whitespace): the output is what a client parses either way, and the
# fewer choices the grammar leaves, the more of it is forced (and drafted).
JSON_OPTIONS: Any = {"whitespace_flexible": False}
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def spec_key(spec: GrammarSpec) -> str:
    return hashlib.sha256(f"{spec.kind}\x00{spec.text}".encode()).hexdigest()


def to_llguidance(spec: GrammarSpec) -> str:
    """The llguidance grammar text for a spec; raises InvalidRequest when it cannot be read."""
    import llguidance

    try:
        if spec.kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS))
        if spec.kind == "gbnf":
            from llguidance.gbnf_to_lark import any_to_lark

            return str(llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.text)))
        if spec.kind == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(spec.text))
        if spec.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(spec.text))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the converters raise ValueError with the reason; a library panic too
        raise InvalidRequest(f"the {spec.kind} grammar does not compile: {short_error(exc)}") from None
    raise InvalidRequest(f"unknown grammar kind {spec.kind!r}")


class CompiledGrammar:
    """One compiled grammar: its initial parse state, copied for every sequence, and the bytes
    it is estimated to hold (what the cache's budget counts)."""

    __slots__ = ("key", "_template", "_n_vocab", "_eog", "compile_s", "nbytes")

    def __init__(self, key: str, template: Any, n_vocab: int, compile_s: float, nbytes: int = 0,
                 eog: Iterable[int] = ()) -> None:
        self.key = key
        self._template = template
        self._n_vocab = n_vocab
        self._eog = frozenset(eog)
        self.compile_s = compile_s
        self.nbytes = nbytes

    def matcher(self) -> Matcher:
        return Matcher(self._template.deep_copy(), self._n_vocab, self._eog)


class Matcher:
    """The parse state of one sequence under one grammar (llguidance's LLMatcher)."""

    __slots__ = ("_m", "_words", "_n_vocab", "_eog", "masks")

    def __init__(self, matcher: Any, n_vocab: int, eog: frozenset[int] = frozenset()) -> None:
        self._m = matcher
        self._n_vocab = n_vocab
        self._eog = eog  # the model's end-of-generation tokens: the grammar's end
        self._words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.masks = 0  # whole-vocabulary masks computed (the rest were single-token checks)

    def allows(self, token: int) -> bool:
        return bool(self._m.validate_tokens([int(token)]) == 1)

    def allowed_mask(self) -> np.ndarray:
        """Boolean array over the vocabulary: which tokens may come next."""
        self.masks += 1
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[:self._n_vocab]
        return bits.view(np.bool_)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Boolean array: which of these token ids may come next."""
        return np.fromiter((self.allows(int(t)) for t in ids), dtype=np.bool_, count=len(ids))

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """A copy of the logits with every token the grammar forbids at -inf."""
        allowed = self.allowed_mask()
        if not allowed.any():
            raise InvalidRequest(f"the grammar allows no token here: {short_error(self._m.get_error() or 'no continuation')}")
        return np.where(allowed, logits, np.float32(-np.inf))

    def accept(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise InvalidRequest(f"token {token} does not fit the grammar: {short_error(self._m.get_error())}")

    def forced(self) -> Sequence[int]:
        """Tokens the grammar forces next, in its own (canonical) tokenization; [] when free."""
        if self._m.is_stopped():
            return []
        return list(self._m.compute_ff_tokens())

    def only(self) -> int | None:
        """A token no choice can differ from, whatever the logits, or None: the first forced
        token (the sampler takes it wherever the grammar forces bytes, so the model reads
        forced text in its tokenizer's own tokens), or, once the output is complete and the
        mask admits end-of-generation tokens alone, one of them (any of them ends the
        sequence alike). The forced tokens are asked first (cheap, and [] wherever the output
        is free); the whole mask only where the output may be complete."""
        forced = self.forced()
        if forced:
            return int(forced[0])
        if not self._eog or not self._m.is_accepting():  # stopped (complete) is accepting too
            return None
        allowed = np.flatnonzero(self.allowed_mask())
        if allowed.size and all(int(t) in self._eog for t in allowed):
            return int(allowed[0])
        return None

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of the tokens, in order, fit the grammar from here (nothing is consumed)."""
        return int(self._m.validate_tokens([int(t) for t in tokens])) if tokens else 0

    @property
    def accepting(self) -> bool:
        return bool(self._m.is_accepting())


class GrammarCompiler:
    """The model's vocabulary for llguidance (built once) and a bounded cache of compiled grammars."""

    def __init__(self, vocab: ll.llama_vocab_p, n_vocab: int, eog: Iterable[int], capacity: int = CACHE_SIZE,
                 capacity_bytes: int = CACHE_BYTES) -> None:
        self._vocab = vocab
        self._n_vocab = n_vocab
        self._eog = sorted(eog)
        self._capacity = capacity
        self.capacity_bytes = capacity_bytes
        self.cached_bytes = 0
        self._compile_lock = threading.Lock()  # one new grammar at a time: its memory is measured alone
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._closing = False
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.compiled = 0
        self.hits = 0

    def tokenizer(self) -> Any:
        """llguidance's view of the vocabulary, built once: every token's bytes, control tokens
        (and user-defined ones that look like them) marked special, llama.cpp's tokenizer for
        text, and every end-of-generation token as the grammar's end."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                import llguidance

                buffer = ctypes.create_string_buffer(1024)
                pieces = []
                for token in range(self._n_vocab):
                    if self._closing and token % 4096 == 0:
                        raise InvalidRequest("the engine is closing")
                    pieces.append(_piece(self._vocab, token, buffer))
                tokenize = ctypes.cast(ll.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
                self._tokenizer = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                    tokens=pieces, vocab_ptr=self._vocab, tokenize_fptr=tokenize, eos_token=self._eog, slices=None)
            return self._tokenizer

    def close(self) -> None:
        """Stop a vocabulary build under way and wait for it (the vocabulary is about to be freed)."""
        self._closing = True
        with self._tokenizer_lock:
            pass

    def cached(self, spec: GrammarSpec) -> CompiledGrammar | None:
        with self._lock:
            compiled = self._cache.get(spec_key(spec))
            if compiled is not None:
                self._cache.move_to_end(compiled.key)
                self.hits += 1
            return compiled

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar (from the cache when seen before); raises InvalidRequest.

        A new grammar is compiled against the vocabulary and probed (`_probe`: its first masks
        computed) before it is cached, so a grammar that fails as generation starts fails here
        and nothing of it is kept; its memory is measured around both (`_footprint`), and the
        cache evicts the least recently used grammars to stay within `capacity` grammars and
        `capacity_bytes` (a grammar larger than the whole budget is used, never kept)."""
        compiled = self.cached(spec)
        if compiled is not None:
            return compiled
        import llguidance

        tokenizer = self.tokenizer()
        with self._compile_lock:
            compiled = self.cached(spec)
            if compiled is not None:
                return compiled
            started, before = time.perf_counter(), _rss()
            text = to_llguidance(spec)
            limits = parser_limits()
            error = llguidance.LLMatcher.validate_grammar(text, tokenizer, limits=limits)
            if error:
                raise InvalidRequest(f"the {spec.kind} grammar does not compile: {short_error(error)}")
            template = llguidance.LLMatcher(tokenizer, text, log_level=0, limits=limits)
            if template.is_error():
                raise InvalidRequest(f"the {spec.kind} grammar does not compile: {short_error(template.get_error())}")
            self._probe(template, spec)
            nbytes = _footprint(before, _rss(), text)
            compiled = CompiledGrammar(spec_key(spec), template, self._n_vocab, time.perf_counter() - started, nbytes,
                                       self._eog)
        with self._lock:
            self.compiled += 1
            if nbytes > self.capacity_bytes:
                return compiled
            self._cache[compiled.key] = compiled
            self.cached_bytes += nbytes
            while len(self._cache) > self._capacity or self.cached_bytes > self.capacity_bytes:
                _, evicted = self._cache.popitem(last=False)
                self.cached_bytes -= evicted.nbytes
        return compiled

    def _probe(self, template: Any, spec: GrammarSpec) -> None:
        """Walk `PROBE_STEPS` steps of one path through the grammar (forced tokens, then the
        lowest allowed token), computing each mask as generation would; raise where it fails."""
        probe = template.deep_copy()
        words = np.zeros((self._n_vocab + 31) // 32, dtype=np.int32)
        for _ in range(PROBE_STEPS):
            if probe.is_stopped():
                return
            forced = probe.compute_ff_tokens()
            if forced:
                probe.consume_tokens(forced)
            if not probe.is_error():
                probe.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            if probe.is_error():
                raise InvalidRequest(f"the {spec.kind} grammar fails as generation starts: "
                                     f"{short_error(probe.get_error())}")
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:self._n_vocab]
            allowed = np.flatnonzero(bits)
            if allowed.size == 0:
                raise InvalidRequest(f"the {spec.kind} grammar allows no token as generation starts")
            if not probe.consume_token(int(allowed[0])):
                return

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"grammars_cached": len(self._cache), "grammars_compiled": self.compiled,
                    "grammar_cache_hits": self.hits, "grammar_cache_bytes": self.cached_bytes}


def _piece(vocab: ll.llama_vocab_p, token: int, buffer: Any) -> bytes:
    n = ll.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
    piece = bytes(buffer[:n]) if n > 0 else b""
    attr = ll.llama_vocab_get_attr(vocab, token)
    if attr & ll.LLAMA_TOKEN_ATTR_CONTROL or (attr & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
        piece = b"\xff" + piece  # llguidance's mark of a special token
    return piece


def _rss() -> int:
    """The process's resident memory in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def _footprint(before: int, after: int, text: str) -> int:
    """What one compiled grammar holds, estimated: the resident memory its compile and probe
    added (measured alone, under the compile lock), and at least 64 bytes per character of its
    grammar text (its parse tables), with a floor of 64 KiB."""
    return max(after - before, 64 * len(text), 64 * 1024)
