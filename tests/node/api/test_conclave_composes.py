"""The Conclave composed with the rest of the node, on the real Gemma model through a live node:
speculation on and off (the candidates drafting for each other), the prefix cache, L1,
structured output, plain users in the same batch, and cancelled losers freeing their KV.

Greedy text may part at a near-tie when the batch around it changes (llama.cpp's CPU
kernels are not batch-invariant): a difference is accepted only where the plain greedy run's
top two tokens are less than NEAR_TIE apart, never at a clear margin. A seeded explorer's text
may part only where its draw fell so near the edge of the chosen token's share that logits
NEAR_TIE apart move the edge past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from typing import NamedTuple

import aiohttp
import jsonschema
import pytest

from node.serving.conclave.start import StartRecord
from tests.node.api.live import LiveNode, drafting_node, http_json, metric, node_settings, settled
from tests.node.near_ties import NEAR_TIE, draw_near_an_edge

pytestmark = pytest.mark.model

RESTORED = "reame_prefix_cache_tokens_restored_total"
COUNT = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]
COPY = [{"role": "user", "content": "Copy the list exactly.\nList: red apple, green pear, yellow lemon, purple plum, "
                                    "orange peach, white grape."}]
DOC = " ".join(f"Box {i} holds {i * 7 % 10 + 1} {('red', 'blue', 'green')[i % 3]} marbles." for i in range(36))


@pytest.fixture(scope="module")
def node(gemma_path, tmp_path_factory):
    """Six slots (a Conclave of three and three plain users), the prefix cache, drafts."""
    home = tmp_path_factory.mktemp("conclave-mix")
    # resident prefixes off: the prefix cache's tiers are what these tests follow
    settings = node_settings(gemma_path, home, **{"server.parallel": 6, "cache.enabled": True, "cache.resident": False,
                                                  "cache.directory": str(home / "cache"), "arca.observe": False})
    with drafting_node(settings) as live:
        assert "lookup" in live.state.speculation.source_names
        yield live


@pytest.fixture(scope="module")
def uncached(gemma_path, tmp_path_factory):
    """A second node of the same build with the prefix cache (and resident prefixes) off."""
    with LiveNode(node_settings(gemma_path, tmp_path_factory.mktemp("uncached"),
                                **{"arca.observe": False, "cache.resident": False})) as live:
        yield live


def chat(node, body: dict) -> tuple[dict, dict]:
    status, headers, reply = http_json("POST", f"{node.url}/v1/chat/completions", body, timeout=300)
    assert status == 200, reply
    return reply, headers


def content(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


@contextlib.contextmanager
def watching(node):
    """The node's Conclave runs while in the block (their candidates' texts and finishes)."""
    jobs = node.state.service.jobs
    runs = []
    start = jobs.start_conclave

    def recording(job):
        run = start(job)
        runs.append(run)
        return run

    jobs.start_conclave = recording
    try:
        yield runs
    finally:
        del jobs.start_conclave


@contextlib.contextmanager
def policy(node, **changes):
    """The node's Conclave settings changed while in the block."""
    service = node.state.service
    before = service.options
    changed = dataclasses.replace(before, conclave=dataclasses.replace(before.conclave, **changes))
    service.planner.options = service.jobs.options = changed  # the keys and the runs alike
    try:
        yield
    finally:
        service.planner.options = service.jobs.options = before


def assert_freed(node) -> None:
    stats = settled(node)
    assert stats["active"] == stats["queued"] == 0
    assert stats["kv_cells_reserved"] == stats["kv_cells_used"] == 0
    assert stats["slots_free"] == stats["slots_total"]
    controller = node.state.speculation
    assert not controller._seqs  # every sequence's draft state ended with it


class PlainToken(NamedTuple):
    """One token of a plain undrafted answer: its text, its top logprobs best first and their
    tokens' texts in the same order."""
    token: str
    top: list[float]
    alternatives: list[str]


def plain_logprobs(node, body: dict, path: str = "chat/completions") -> list[PlainToken]:
    """Each token of the plain answer to `body`, undrafted."""
    return plain_run(node, body, path)[0]


def plain_run(node, body: dict, path: str = "chat/completions") -> tuple[list[PlainToken], int]:
    """plain_logprobs, and the prompt's length in tokens (the position of the answer's first token)."""
    chat_path = path.startswith("chat")
    extra = {"logprobs": True, "top_logprobs": 20} if chat_path else {"logprobs": 20}
    plain = {k: v for k, v in body.items() if k not in ("conclave", "stream")}
    status, _, reply = http_json("POST", f"{node.url}/v1/{path}", {**plain, **extra, "speculation": False,
                                                                    "stop": ["\x01never"]}, timeout=300)
    assert status == 200, reply
    prompt_tokens = reply["usage"]["prompt_tokens"]
    if chat_path:
        return [PlainToken(e["token"], [t["logprob"] for t in e["top_logprobs"]],
                           [t["token"] for t in e["top_logprobs"]])
                for e in reply["choices"][0]["logprobs"]["content"]], prompt_tokens
    lp = reply["choices"][0]["logprobs"]
    entries = []
    for token, top in zip(lp["tokens"], lp["top_logprobs"]):
        ranked = sorted(top.items(), key=lambda item: item[1], reverse=True)
        entries.append(PlainToken(token, [v for _, v in ranked], [t for t, _ in ranked]))
    return entries, prompt_tokens


def partings(entries: list[PlainToken], other: str) -> list[int]:
    """Where `other` may have left the plain run, by index of the plain run's token: text alone
    cannot say where two token sequences part when one token's text begins another's (" the"
    and " theory"), so each place where `other` goes on with one of the plain run's other
    candidate tokens counts, up to the first place where the plain token's text stops fitting."""
    places, prefix = [], ""
    for i, entry in enumerate(entries):
        rest = other[len(prefix):]
        if not rest.startswith(entry.token):
            return places + [i]
        if any(alt != entry.token and rest.startswith(alt) for alt in entry.alternatives):
            places.append(i)
        prefix += entry.token
    assert places, f"outputs differ but no token of the plain run parts from {other!r}"
    return places


def assert_near_tie(node, body: dict, other: str, path: str = "chat/completions") -> None:
    """`other` parts from the plain greedy answer to `body` at a near-tie of the plain run."""
    entries = plain_logprobs(node, body, path)
    gaps = [entries[i].top[0] - entries[i].top[1] if len(entries[i].top) > 1 else float("inf")
            for i in partings(entries, other)]
    assert min(gaps) < NEAR_TIE, f"diverged at a clear margin {min(gaps):.3f}: {other!r}"


def assert_near_boundary(node, body: dict, other: str) -> None:
    """`other`, a sample of `body` (its seed), parts from the plain sample where that token's draw
    fell near an edge: moving one of the plain run's best logits by NEAR_TIE changes what the
    engine's own sampler draws there, with the engine's own noise for that position and those
    token ids (`gumbel(seed, position, DRAW, ids)`). The sampler is replayed whole over the plain
    run's top logprobs, each at its token's id (an alternative whose text is not one token is
    left out), so an edge of the top_p / min_p cut counts as well as a near-tie of scores."""
    from node.engine.types import SamplingParams

    engine = node.state.engine
    entries, prompt_tokens = plain_run(node, body)
    params = SamplingParams(temperature=body["temperature"], top_k=body.get("top_k", 40),
                            top_p=body.get("top_p", 0.95), min_p=body.get("min_p", 0.05), seed=body["seed"])

    def near_edge(i: int) -> bool:
        ids = [engine.tokenize(alt, add_bos=False, special=False) for alt in entries[i].alternatives]
        known = [(one[0], logprob) for one, logprob in zip(ids, entries[i].top) if len(one) == 1]
        return draw_near_an_edge(params, engine._model.n_vocab, prompt_tokens + i, known)

    places = partings(entries, other)
    assert any(near_edge(place) for place in places), (
        f"the sample parted at token {places[-1]} where its draw was far from any edge of "
        f"{[round(math.exp(value), 4) for value in entries[places[-1]].top]}: {other!r}")


def lookup_stats(node) -> dict:
    return node.state.speculation.stats.snapshot()["lookup"]


def kept(node) -> int:
    """Draft tokens kept so far from the sources that read earlier text: the prompt's and the
    group's (lookup), the candidates' own (sibling), the node's (archive)."""
    stats = node.state.speculation.stats.snapshot()
    return sum(stats[source]["accepted"] for source in ("lookup", "sibling", "archive"))


@contextlib.contextmanager
def sibling_drafts(node):
    """Counts the prompt-lookup drafts taken from another candidate's generated tokens."""
    lookup = node.state.speculation.source("lookup")
    counts = {"proposed": 0, "from_sibling": 0}
    propose = lookup.propose

    def observed(seq, context, k):
        draft = propose(seq, context, k)
        if draft is not None:
            counts["proposed"] += 1
            group = lookup._groups[seq.group]
            for n in range(min(lookup.max_n, len(context)), lookup.min_n - 1, -1):
                hit = group.index.get(tuple(context[len(context) - n:]))
                stream = group.streams.get(hit[0]) if hit is not None else None
                if stream is not None and tuple(stream[hit[1]:hit[1] + k]):
                    counts["from_sibling"] += hit[0] != seq.key and hit[1] >= len(seq.prompt)
                    break
        return draft

    lookup.propose = observed
    try:
        yield counts
    finally:
        del lookup.propose


# -- 1. speculation ----------------------------------------------------------------------------

def test_speculation_on_and_off_give_the_same_conclave(node):
    body = {"messages": COPY, "max_tokens": 16, "temperature": 0, "seed": 3, "conclave": 3}
    with watching(node) as runs:
        off, _ = chat(node, {**body, "speculation": False, "stop": ["\x00off"]})
        before = lookup_stats(node)
        on, _ = chat(node, {**body, "speculation": True, "stop": ["\x00on"]})
        after = lookup_stats(node)
    assert_freed(node)
    assert after["proposals"] > before["proposals"] and after["accepted"] > before["accepted"]
    if not parted(node, body, runs[0], runs[1]):
        assert content(on) == content(off) and on["reame"] == off["reame"]


def parted(node, body: dict, run, other) -> bool:
    """Whether two runs of one Conclave differ in some candidate, each difference checked to be
    a near-tie (candidate 0 is the greedy request) or a near-edge draw (candidate i samples
    with seed + i) of the plain runs on `node`."""
    found = False
    for i, (a, b) in enumerate(zip(run.candidates, other.candidates)):
        if a.text != b.text:
            if i == 0:
                assert_near_tie(node, body, b.text)
            else:
                assert_near_boundary(node, {**body, "temperature": 0.7, "seed": body["seed"] + i}, b.text)
            found = True
    return found


@contextlib.contextmanager
def shaped_candidates(node, shape):
    """The node's Conclave candidates rewritten by `shape(requests, group)` before they are submitted."""
    jobs = node.state.service.jobs
    submit = jobs.submit_group
    jobs.submit_group = lambda requests, spare=0, group=None: submit(shape(list(requests), group), spare, group)
    try:
        yield
    finally:
        del jobs.submit_group


def test_a_late_candidate_drafts_from_the_finished_ones(node):
    """Candidate 1 is cut after two tokens, so it disagrees with candidate 0 and candidate 2 starts
    once both have finished; it is the greedy request again and drafts its text from candidate 0's
    (16 tokens in at most 4 steps, where plain decoding takes 15)."""
    greedy = []

    def shape(requests, group):
        if group is None:
            greedy.append(requests[0].sampling)
            return [requests[0], dataclasses.replace(requests[1], sampling=greedy[0], max_tokens=2)]
        return [dataclasses.replace(r, sampling=greedy[0]) for r in requests]

    body = {"messages": COPY, "max_tokens": 16, "temperature": 0, "conclave": 3, "speculation": True}
    before = kept(node)
    with watching(node) as runs, sibling_drafts(node) as drafts, shaped_candidates(node, shape):
        reply, _ = chat(node, {**body, "stop": ["\x00late"]})
    assert_freed(node)
    first, _, late = runs[0].candidates
    assert reply["reame"]["started"] == 3 and late.finished.completion_tokens == 16
    if late.text[:16] != first.text[:16]:  # they part at once: no text of candidate 0 to draft from
        assert_near_tie(node, body, late.text)
        return
    # candidate 0's text was drafted for it as long as they agreed: by prompt lookup from the
    # finished sibling, or by the Palimpsest, which holds candidate 0's text once it finished and
    # trusts a match that long at once, drafting the late answer whole before lookup is asked twice
    assert drafts["from_sibling"] > 0 or late.finished.steps <= 4, (drafts, late.finished.steps)
    if late.text == first.text:  # about the whole answer was drafted (the Palimpsest holds candidate 0's text too)
        assert kept(node) - before >= 8
    else:
        assert_near_tie(node, body, late.text)


# -- 2. prefix cache ---------------------------------------------------------------------------

def test_a_conclave_restores_a_cached_prefix_and_answers_as_without_it(node, uncached):
    system = {"role": "system", "content": DOC}
    warm, _ = chat(node, {"messages": [system, {"role": "user", "content": "How many boxes are there?"}],
                          "max_tokens": 4, "temperature": 0})
    assert warm["usage"]["prompt_tokens"] > 300
    body = {"messages": [system, {"role": "user", "content": "What is in box 4?"}], "max_tokens": 10,
            "temperature": 0, "seed": 5, "conclave": 3, "speculation": False}
    before = metric(node.url, RESTORED)
    with watching(node) as runs:
        cached, _ = chat(node, body)
    restored = metric(node.url, RESTORED) - before
    assert restored >= 256, restored  # most of the shared system message came from the cache
    with watching(uncached) as plain_runs:
        plain, _ = chat(uncached, body)
    assert_freed(node)
    tokens = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [cached["usage"][k] for k in tokens] == [plain["usage"][k] for k in tokens]
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] == restored  # what the group did not compute
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    if not parted(uncached, body, plain_runs[0], runs[0]):
        assert content(cached) == content(plain) and cached["reame"] == plain["reame"]


# -- 3. L1 -------------------------------------------------------------------------------------

def test_a_deterministic_conclave_is_an_l1_hit_keyed_by_n_and_explore_settings(node):
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6, "temperature": 0,
            "conclave": 3}
    first, headers = chat(node, body)
    assert headers["X-Reame-Cache"] == "miss"
    node.call(node.state.service.drain())
    again, headers = chat(node, body)
    assert headers["X-Reame-Cache"] == "hit"
    assert content(again) == content(first) and again["reame"] == first["reame"]

    async def streamed():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await ask(session, node.url, "chat/completions", {**body, "stream": True})
    assert asyncio.run(streamed()) == (content(first), first["reame"])  # a streamed hit, verdict included
    assert chat(node, {**body, "conclave": 2})[1]["X-Reame-Cache"] == "miss"
    assert chat(node, {**body, "seed": 9})[1]["X-Reame-Cache"] == "miss"
    with policy(node, explore_temperature=0.9):
        assert chat(node, body)[1]["X-Reame-Cache"] == "miss"
    with policy(node, adaptive=False):
        assert chat(node, body)[1]["X-Reame-Cache"] == "miss"
    assert_freed(node)


# -- 4. structured output ----------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "score": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["answer", "score"], "additionalProperties": False}


def test_a_structured_conclave_votes_on_valid_parsed_answers(node):
    body = {"messages": [{"role": "user", "content": "Is the sea salty? Answer as JSON."}], "max_tokens": 32,
            "temperature": 0, "conclave": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "yn", "schema": SCHEMA,
                                                                       "strict": True}}}
    with watching(node) as runs, policy(node, adaptive=False):  # all three run: every one is checked
        reply, _ = chat(node, body)
    assert_freed(node)
    winner = json.loads(content(reply))
    jsonschema.validate(winner, SCHEMA)
    finished = [c for c in runs[0].candidates if c.finished is not None and c.finished.reason == "stop"]
    assert len(finished) >= 2
    for candidate in finished:
        jsonschema.validate(json.loads(candidate.text), SCHEMA)
    votes = reply["reame"]["votes"]
    for answer in votes:  # the vote is on the parsed value (canonical JSON), never on spelling
        jsonschema.validate(json.loads(answer), SCHEMA)
    assert json.dumps(winner, sort_keys=True, separators=(",", ":")) in votes
    if reply["reame"]["stopped_early"]:  # decided by a majority: a candidate finishing after it has no vote
        assert 2 <= sum(votes.values()) <= len(finished)
    else:
        assert sum(votes.values()) == len(finished)


NOTE = {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 8},
                                         "score": {"type": "number", "minimum": 0, "maximum": 5}},
        "required": ["ok"], "additionalProperties": False}


def test_answers_cut_by_max_tokens_never_vote_in_a_structured_conclave(node):
    """A max_tokens that cuts some candidates mid-object (numbers are bounded to 10 decimals, which
    the base model writes out in full): the numbers inside a half-written object are no answer,
    and a whole answer wins over cut ones."""
    body = {"messages": [{"role": "user", "content": "Write one example record as JSON."}], "max_tokens": 20,
            "temperature": 0, "seed": 45, "conclave": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "note", "schema": NOTE,
                                                                       "strict": True}}}
    # A start record of its own: the module's Conclaves before this one mostly disagreed, so the
    # node's record would start all three at once, and then the two short answers can agree
    # (a majority) while candidate 0 is still writing its number, cancelling it before its
    # max_tokens. Majority-first, candidates 0 and 1 run, 1's short answer cannot settle it while
    # 0 runs, 0 is cut, and only then does 2 start.
    jobs = node.state.service.jobs
    kept, jobs.conclave_starts = jobs.conclave_starts, StartRecord()
    try:
        with watching(node) as runs:
            reply, _ = chat(node, body)
    finally:
        jobs.conclave_starts = kept
    assert_freed(node)
    candidates = runs[0].candidates
    whole = [c for c in candidates if c.finished.reason == "stop"]
    assert any(c.finished.reason == "length" for c in candidates), [c.text for c in candidates]
    for answer in reply["reame"]["votes"]:
        jsonschema.validate(json.loads(answer), NOTE)
    if whole:
        assert reply["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(content(reply)), NOTE)


# -- 5. other users in the batch ---------------------------------------------------------------

USERS = [("completions", {"prompt": "One, two, three, four,", "max_tokens": 10, "temperature": 0}),
         ("chat/completions", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 10,
                               "temperature": 0, "stream": True}),
         ("completions", {"prompt": "The capital of Italy is", "max_tokens": 10, "temperature": 0,
                          "stream": True})]


async def ask(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> tuple[str, dict | None]:
    """(text, reame object) of one completion or chat answer, streamed or not."""
    async with session.post(f"{url}/v1/{path}", json=body) as response:
        assert response.status == 200, await response.text()
        if not body.get("stream"):
            reply = await response.json()
            choice = reply["choices"][0]
            return (choice["message"]["content"] if "message" in choice else choice["text"]), reply.get("reame")
        parts, reame = [], None
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            reame = chunk.get("reame", reame)
            for choice in chunk["choices"]:
                parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        return "".join(parts), reame


def test_a_conclave_next_to_three_plain_users(node):
    vote = {"messages": COUNT, "max_tokens": 16, "temperature": 0.6, "seed": 21, "conclave": 3, "stream": True}

    async def run():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            alone = [await ask(session, node.url, path, {**body, "stop": ["\x00alone"]}) for path, body in USERS]
            together = await asyncio.gather(ask(session, node.url, "chat/completions", vote),
                                            *(ask(session, node.url, path, body) for path, body in USERS))
            return alone, together

    alone, together = asyncio.run(run())
    (voted, reame), users = together[0], together[1:]
    assert voted and reame is not None and reame["candidates"] == 3
    for (path, body), (text, _), (single, _) in zip(USERS, users, alone):
        assert text
        if text != single:
            assert_near_tie(node, body, text, path)
    assert_freed(node)


# -- 6. cancelled losers -----------------------------------------------------------------------

def test_cancelled_losers_free_their_kv_with_speculation_on(node):
    """All three candidates greedy (so the first two agree), the third with a long max_tokens: the
    majority stops it mid-generation, while it drafts."""
    def shape(requests, group):
        first = requests[0]
        greedy = dataclasses.replace(first.sampling, temperature=0.0)  # the first two agree whatever the kernels
        return [dataclasses.replace(r, sampling=greedy, max_tokens=first.max_tokens * (8 if i == 2 else 1))
                for i, r in enumerate(requests)]

    cancelled = metric(node.url, "reame_conclave_candidates_total", outcome="cancelled")
    with shaped_candidates(node, shape), policy(node, adaptive=False):
        reply, _ = chat(node, {"messages": COUNT, "max_tokens": 8, "temperature": 0.5, "seed": 2,
                               "conclave": 3, "speculation": True})
    assert reply["reame"]["stopped_early"] and reply["reame"]["consensus"] == 2
    assert metric(node.url, "reame_conclave_candidates_total", outcome="cancelled") - cancelled == 1
    assert_freed(node)
