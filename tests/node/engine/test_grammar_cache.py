"""The engine's compiled grammars: bounded by bytes, failures never kept, errors short.

A 300-byte pattern such as `^(b{1000}){1000}$` compiled, was cached, and failed at the first
mask ("too many expressions") after its lexer had built ~220 MB, kept by a cache bounded only
by count (64 grammars: ~14 GB). The request parser now refuses such patterns
(tests/node/serving/test_schema_limits.py); here they go straight to the engine, as nothing
else could send them, to show what the engine itself does: the compile probes the first
masks, fails with a short message, keeps nothing, and gives the memory back. Real Gemma
vocabulary (the engine suite's one engine).
"""

from __future__ import annotations

import json

import pytest

from node.engine.errors import InvalidRequest
from node.engine.types import GrammarSpec

pytestmark = pytest.mark.model


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def pattern_spec(pattern: str) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps({"type": "object", "properties": {
        "a": {"type": "string", "pattern": pattern}}, "required": ["a"]}))


def test_grammars_that_fail_as_generation_starts_are_refused_short_and_never_kept(engine):
    engine.warm_grammars()
    before, grammars = rss_mb(), engine.grammars.stats()
    for letter in "bcdef":
        with pytest.raises(InvalidRequest) as caught:
            engine.prepare_grammar(pattern_spec(f"^({letter}{{1000}}){{1000}}$"))
        assert "fails as generation starts" in str(caught.value) and len(str(caught.value)) < 400
    after = engine.grammars.stats()
    assert after["grammars_cached"] == grammars["grammars_cached"]
    assert after["grammar_cache_bytes"] == grammars["grammar_cache_bytes"]
    assert rss_mb() - before < 300, f"RSS grew {rss_mb() - before:.0f} MB over five failed grammars"


def test_the_cache_stays_within_its_byte_budget(engine):
    grammars = engine.grammars
    saved = grammars.capacity_bytes
    grammars.capacity_bytes = 4 * 64 * 1024 + 1  # four grammars at the smallest estimate
    try:
        for i in range(12):
            compiled = engine.prepare_grammar(pattern_spec(f"^item-{i}-[a-z]{{3}}$"))
            assert compiled.nbytes >= 64 * 1024
            assert grammars.cached_bytes <= grammars.capacity_bytes
        stats = grammars.stats()
        assert 1 <= stats["grammars_cached"] <= 4 and stats["grammar_cache_bytes"] == grammars.cached_bytes
        assert grammars.cached(pattern_spec("^item-11-[a-z]{3}$")) is not None  # the newest is kept
        assert grammars.cached(pattern_spec("^item-0-[a-z]{3}$")) is None      # the oldest went first
    finally:
        grammars.capacity_bytes = saved
