"""L4 corpus through the Archive API: draft table, namespaces, budget eviction, SINCE, restart."""

from __future__ import annotations

import random

import pytest

from arca.archive import Archive, ArchiveConfig, ArchiveError, ArchiveOOMError
from shared.tokens import pack_tokens, unpack_tokens


@pytest.fixture
def arc(tmp_path):
    archive = Archive(ArchiveConfig(directory=tmp_path))
    yield archive
    archive.close()


def observe_all(arc, streams, ns=b"default"):
    return [arc.observe(ns, pack_tokens(stream)) for stream in streams]


DRAFT_TABLE = [
    # (observed streams oldest first, tail, k, expected)
    pytest.param([[10, 11, 12, 13, 14]], [10, 11, 12], 4, [13, 14], id="original-example"),
    pytest.param([[1, 2, 3, 4, 50], [9, 3, 4, 60]], [1, 2, 3, 4], 4, [50], id="longest-beats-newer-shorter"),
    pytest.param([[1, 2, 3, 4, 50], [9, 3, 4, 60]], [7, 3, 4], 4, [60], id="newest-among-equal-length"),
    pytest.param([[5, 6, 70, 71], [5, 6, 80, 81]], [5, 6], 1, [80], id="k-limits"),
    pytest.param([[1, 2, 3]], [2, 3], 4, None, id="match-at-stream-end-has-no-continuation"),
    pytest.param([[1, 2, 3, 4], [100, 101]], [2, 3], 5, [4], id="never-crosses-stream-end"),
    pytest.param([[7, 8, 9], [1, 7, 8]], [7, 8], 3, [9], id="older-occurrence-with-continuation"),
    pytest.param([[1, 2], [3, 4, 5]], [2, 3], 4, [4, 5], id="no-match-across-stream-start"),
    pytest.param([[1, 2, 1, 2, 9]], [1, 2], 4, [9], id="newest-position-within-stream"),
    pytest.param([[1, 2, 3]], [42], 4, None, id="unknown-token"),
    pytest.param([[1, 2, 3]], [], 4, None, id="empty-tail"),
]


@pytest.mark.parametrize("streams, tail, k, expected", DRAFT_TABLE)
def test_draft_table(arc, streams, tail, k, expected):
    observe_all(arc, streams)
    assert arc.draft(b"default", tail, k) == expected


def test_ngram_min_bounds_short_matches(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path, ngram_min=2, ngram_max=4)) as arc:
        observe_all(arc, [[5, 6, 7, 8]])
        assert arc.draft(b"default", [9, 6], 4) is None        # only a 1-gram matches
        assert arc.draft(b"default", [5, 6], 4) == [7, 8]


def test_ngram_max_caps_match_length(tmp_path):
    with Archive(ArchiveConfig(directory=tmp_path, ngram_min=1, ngram_max=2)) as arc:
        observe_all(arc, [[1, 2, 3, 40], [9, 2, 3, 50]])
        assert arc.draft(b"default", [1, 2, 3], 4) == [50]      # 3-gram not considered


def test_namespaces_never_mix(arc):
    observe_all(arc, [[1, 2, 3]], ns=b"model-a")
    observe_all(arc, [[1, 2, 4]], ns=b"model-b")
    assert arc.draft(b"model-a", [1, 2], 4) == [3]
    assert arc.draft(b"model-b", [1, 2], 4) == [4]
    assert arc.draft(b"model-c", [1, 2], 4) is None
    assert arc.draft(b"default", [1, 2], 4) is None


def test_since_pages_through_streams(arc):
    ids = observe_all(arc, [[1], [2, 3], [4, 5, 6]], ns=b"m")
    observe_all(arc, [[99]], ns=b"other")
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [(i, list(unpack_tokens(p))) for i, p in arc.since(b"m", 0, 10)] == [
        (ids[0], [1]), (ids[1], [2, 3]), (ids[2], [4, 5, 6])]
    assert [i for i, _ in arc.since(b"m", ids[0], 1)] == [ids[1]]
    assert arc.since(b"m", ids[2], 10) == []
    assert arc.since(b"nothing", 0, 10) == []


def test_bad_payloads_and_k(arc):
    with pytest.raises(ArchiveError, match="multiple of 4"):
        arc.observe(b"default", b"\x01\x00\x00")
    with pytest.raises(ArchiveError, match="empty"):
        arc.observe(b"default", b"")
    for k in (0, -1):
        with pytest.raises(ArchiveError, match="positive"):
            arc.draft(b"default", [1], k)
    with pytest.raises(ArchiveError, match="at most 256"):
        arc.draft(b"default", [1], 257)


def test_budget_evicts_oldest_streams(tmp_path):
    config = ArchiveConfig(directory=tmp_path, corpus_max_bytes=4 * 10)
    with Archive(config) as arc:
        first, second, third = observe_all(arc, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
        assert [i for i, _ in arc.since(b"default", 0, 10)] == [second, third]
        assert arc.draft(b"default", [1, 2], 4) is None
        assert arc.draft(b"default", [5, 6], 4) == [7, 8]
        stats = arc.info()["arca"]
        assert stats["corpus_streams"] == 2 and stats["corpus_tokens"] == 8
        assert stats["corpus_used_bytes"] <= config.corpus_max_bytes
        with pytest.raises(ArchiveOOMError):
            arc.observe(b"default", pack_tokens(range(11)))
    with Archive(config) as arc:
        assert [i for i, _ in arc.since(b"default", 0, 10)] == [second, third]
        fourth = arc.observe(b"default", pack_tokens([1]))
        assert fourth > third                      # ids never repeat, even after a restart


def test_info_counts_hits_and_misses(arc):
    observe_all(arc, [[1, 2, 3]])
    arc.draft(b"default", [1, 2], 2)
    arc.draft(b"default", [7], 2)
    stats = arc.info()["arca"]
    assert (stats["draft_hits"], stats["draft_misses"]) == (1, 1)
    assert stats["corpus_ngrams"] > 0


def reference_draft(streams, tail, k, ngram_min, ngram_max):
    """The specification, by brute force: longest suffix first, newest occurrence first."""
    for n in range(min(len(tail), ngram_max), ngram_min - 1, -1):
        suffix = list(tail[-n:])
        for stream in reversed(streams):
            for end in range(len(stream) - 2, n - 2, -1):
                if stream[end - n + 1:end + 1] == suffix:
                    return stream[end + 1:end + 1 + k]
    return None


def random_streams(rng, count, vocab, low=3, high=40):
    return [[rng.randrange(vocab) for _ in range(rng.randrange(low, high))] for _ in range(count)]


def test_draft_matches_the_reference_with_eviction_and_restart(tmp_path):
    rng = random.Random(7)
    config = ArchiveConfig(directory=tmp_path, corpus_max_bytes=4 * 3000, draft_max_chain=10**6)
    streams = random_streams(rng, 400, vocab=6)
    with Archive(config) as arc:
        ids = observe_all(arc, streams)
        live = [stream for stream_id, stream in zip(ids, streams)
                if stream_id in {i for i, _ in arc.since(b"default", 0, 10**4)}]
        tails = [stream[:rng.randrange(1, 10)] for stream in random_streams(rng, 300, vocab=6, low=10, high=12)]
        before = [arc.draft(b"default", tail, 5) for tail in tails]
        assert before == [reference_draft(live, tail, 5, 1, 8) for tail in tails]
    with Archive(config) as arc:
        assert [arc.draft(b"default", tail, 5) for tail in tails] == before


def test_restart_with_a_big_corpus_loses_nothing(tmp_path):
    rng = random.Random(3)
    config = ArchiveConfig(directory=tmp_path, corpus_max_bytes=4 * 400_000)
    streams = random_streams(rng, 1000, vocab=5000, low=100, high=500)     # ~300k tokens
    with Archive(config) as arc:
        ids = observe_all(arc, streams)
        probes = [(stream[i:i + 4], stream[i + 4:i + 8]) for stream in streams[::50] for i in (0, 20)]
        before = [arc.draft(b"default", tail, 4) for tail, _ in probes]
        assert all(found is not None for found in before)
    with Archive(config) as arc:
        assert [i for i, _ in arc.since(b"default", 0, 10**4)] == ids
        assert [arc.draft(b"default", tail, 4) for tail, _ in probes] == before
        assert arc.info()["arca"]["corpus_tokens"] == sum(map(len, streams))


def test_eviction_compacts_the_token_array(tmp_path):
    rng = random.Random(5)
    config = ArchiveConfig(directory=tmp_path, corpus_max_bytes=4 * 50_000, draft_max_chain=10**6)
    streams = random_streams(rng, 900, vocab=8, low=150, high=250)          # ~180k tokens observed
    with Archive(config) as arc:
        ids = observe_all(arc, streams)
        kept = {i for i, _ in arc.since(b"default", 0, 10**4)}
        live = [stream for stream_id, stream in zip(ids, streams) if stream_id in kept]
        assert arc._corpus.namespaces[b"default"].offset > 0               # the array was compacted
        tails = [rng.choice(live)[5:5 + rng.randrange(1, 9)] for _ in range(100)]
        assert [arc.draft(b"default", t, 3) for t in tails] == [reference_draft(live, t, 3, 1, 8) for t in tails]
