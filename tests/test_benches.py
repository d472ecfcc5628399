"""The comparisons with llama.cpp's server measure what they say: bench/versus_llama_server.py's
workload, peer settings and token accounting, bench/structure.py's timing and grammar, and the
kernel flag both give the peer (bench/llama_server.py). No model and no server: these are the
benches' own functions on the answers' shapes (the two servers' response bodies, as their
sources define them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench import llama_server, structure, versus_llama_server as versus  # noqa: E402
from bench.text_oracle import oracle_steps  # noqa: E402


def test_second_pass_repeats_as_many_requests_as_the_docs_say():
    first, second = versus.workload(False), versus.workload(True)
    repeats = sum(prompt in first for prompt in second)
    assert repeats == len(versus.REPEATED) == 3
    assert [first.index(p) for p in second if p in first] == list(versus.REPEATED)
    claim = f"{repeats} of its {len(second)} requests are repeats"
    assert claim in " ".join(versus.__doc__.split())
    docs = " ".join((ROOT / "docs" / "BENCHMARKS.md").read_text().split())
    assert f"{repeats} exact repeats of the first pass among its {len(second)} requests" in docs


def test_every_peer_setting_can_draft_within_an_answer():
    tokens = 48  # the bench's default answer length
    types = {}
    for name, flags in versus.PEERS:
        if "--spec-type" not in flags:  # no speculation: the model mapped, or read as the node reads it
            assert name.startswith("none") and flags in ([], ["--load-mode", "none"]), (name, flags)
            continue
        values = dict(zip(flags[::2], flags[1::2]))
        types[values["--spec-type"]] = values
        for flag, value in values.items():
            if flag.endswith(("-n-min", "-size-m", "-n-max", "-n-match", "-size-n")):
                assert 0 < int(value) < tokens, (name, flag)
    assert {"ngram-mod", "ngram-simple", "ngram-map-k"} <= set(types)
    # ngram-mod drafts only when n_min tokens chain: its defaults (24, 48) never can in 48 tokens
    assert int(types["ngram-mod"]["--spec-ngram-mod-n-min"]) < tokens


def test_tokens_computed_leave_out_what_a_cache_answered():
    tally = versus.Tally()
    # reame, a miss with a restored prefix: usage.prompt_tokens_details.cached_tokens
    versus.account(tally, {"usage": {"prompt_tokens": 100, "completion_tokens": 10,
                                     "prompt_tokens_details": {"cached_tokens": 60}}}, "miss")
    assert (tally.prefilled, tally.cache_prompt, tally.decoded) == (40, 60, 10)
    # reame, an L1 hit: the whole answer replayed, nothing computed
    versus.account(tally, {"usage": {"prompt_tokens": 100, "completion_tokens": 10,
                                     "prompt_tokens_details": {"cached_tokens": 100}}}, "hit")
    assert (tally.computed, tally.replayed, tally.generated, tally.cache_prompt) == (50, 1, 20, 160)
    # llama-server: its timings, whatever its usage says
    peer = versus.Tally()
    versus.account(peer, {"usage": {"prompt_tokens": 100, "completion_tokens": 12},
                          "timings": {"prompt_n": 30, "cache_n": 70, "predicted_n": 12,
                                      "draft_n": 9, "draft_n_accepted": 5}}, None)
    assert (peer.prefilled, peer.cache_prompt, peer.decoded, peer.drafted) == (30, 70, 12, 5)
    both = tally.add(peer)
    assert both.computed == 50 + 42 and both.generated == 32
    line = versus.line("x", "first", versus.Tally(seconds=2.0, prefilled=100, decoded=20))
    assert "computed    120" in line and "60.0 tok/s" in line


def test_the_peer_runs_the_nodes_kernels():
    assert llama_server.kernel_flags(False) == ["--no-repack"]
    assert llama_server.kernel_flags(True) == []
    assert "--no-repack" in llama_server.kernel_line(False)


def test_every_series_is_timed_alike():
    calls = []

    def attempt():
        calls.append(len(calls))
        return (10, [9.0, 3.0, 2.0, 5.0][len(calls) - 1], "text")

    assert structure.best_of(attempt, 3) == (10, 2.0, "text")
    assert len(calls) == 4  # one warm-up (its 9 s left out) and three timed


def test_the_peers_grammar_admits_compact_json_only():
    grammar = structure.compact_gbnf(structure.SCHEMA)
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines() if " ::= " in line)
    assert rules["space"] == '""'
    assert not re.search(r'" "|\\n|\[ \\t\]', "".join(v for k, v in rules.items() if k != "char"))


def test_the_text_oracle_counts_the_steps_text_seen_allows():
    """bench/text_oracle.py: new text a token a step; a quote of the prompt 16 tokens a step and
    one more; a loop around itself; an answer learned before as a quote of it."""
    new = list(range(100, 148))
    assert oracle_steps([1, 2, 3], new, []) == 47  # nothing to draft from: a step per token after the first
    quote = list(range(200, 248))
    assert oracle_steps([7, *quote, 8], quote, []) == 3  # 47 tokens after the first at 17 a step
    assert oracle_steps([7], quote, [(5, *quote)]) == 3  # learned before
    assert oracle_steps([7], [9] * 48, []) == 4  # a run drafts around itself once it has begun (its second token)
    # a draft is at most max_draft tokens, and only earlier occurrences count (never the context's own end)
    assert oracle_steps([7, *quote, 8], quote, [], max_draft=4) == 10
    assert oracle_steps([7], [7, 8] * 24, [], min_match=3) > oracle_steps([7], [7, 8] * 24, [])

