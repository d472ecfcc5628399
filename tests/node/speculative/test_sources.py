"""Draft sources as tables: prompt lookup, the Palimpsest, and what they propose."""

from __future__ import annotations

import threading

from node.engine.hooks import DraftSeq
from node.speculative.lookup import PromptLookup
from node.speculative.palimpsest import Palimpsest


def seq(key: int, prompt=(), group: int | None = None) -> DraftSeq:
    return DraftSeq(key, key if group is None else group, tuple(prompt), False)


def test_lookup_proposes_what_followed_the_longest_earlier_suffix():
    lookup = PromptLookup()
    s = seq(1)
    lookup.begin(s)
    context = [5, 1, 2, 3, 9, 9, 4, 2, 3, 7, 8, 1, 2, 3]
    # 1 2 3 occurred at 1..3 followed by 9 9 4; 2 3 alone most recently followed by 7 8
    assert lookup.propose(s, context, 3).tokens == (9, 9, 4)
    assert lookup.propose(s, [*context, 9, 9], 2).tokens == (4, 2)
    assert lookup.propose(s, [1, 2, 3, 4], 3) is None or True  # another context: the index is per sequence
    lookup.end(s, context)


def test_lookup_tells_a_quote_of_the_prompt_from_an_echo_of_the_output():
    lookup = PromptLookup()
    prompt = [5, 1, 2, 3, 9, 9, 4]
    s = seq(1, prompt)
    lookup.begin(s)
    quote = lookup.propose(s, [*prompt, 8, 1, 2], 3)  # "1 2" is in the prompt, followed by 3 9 9
    assert quote is not None and quote.tokens == (3, 9, 9) and not quote.echo
    output = [*prompt, 8, 1, 2, 6, 6, 0, 6, 6]  # "6 6" is in the output, followed by 0 6 6
    echo = lookup.propose(s, output, 3)
    assert echo is not None and echo.tokens == (0, 6, 6) and echo.echo
    assert echo.head(2).echo  # a cut draft stays an echo
    # a copy of the prompt under way: "1 2" last occurred in the output's own copy, yet it is a quote
    t = seq(2, prompt)
    lookup.begin(t)
    copying = lookup.propose(t, [*prompt, 1, 2, 3, 9, 1, 2], 2)
    assert copying is not None and copying.tokens == (3, 9) and not copying.echo


def test_lookup_measures_the_run_its_ngram_ends():
    """The draft's match is how far back the context agrees with the occurrence found, not the
    n-gram's length: a copy under way has a long run, a recurring pair a short one."""
    lookup = PromptLookup()
    s = seq(1)
    lookup.begin(s)
    source = list(range(100, 140))
    copying = [*source, 7, *source[:20]]  # the copy has reached its 20th token
    draft = lookup.propose(s, copying, 4)
    assert draft is not None and draft.tokens == tuple(source[20:24]) and draft.match == 20
    far = [*source, 7, *source[:5], 8, *source[5:20]]  # 15 agree, then the 8 breaks the run
    t = seq(2)
    lookup.begin(t)
    assert lookup.propose(t, far, 4).match == 15
    chance = [1, 2, 50, 9, 9, 60, 1, 2]  # a pair seen once before, nothing agrees behind it
    u = seq(3)
    lookup.begin(u)
    assert lookup.propose(u, chance, 2).match == 2
    long_copy = [*range(200, 280), 7, *range(200, 260)]
    v = seq(4)
    lookup.begin(v)
    assert lookup.propose(v, long_copy, 4).match == 32  # MAX_RUN: no longer scan


def test_lookup_index_grows_with_the_context_only_once_per_token():
    lookup = PromptLookup()
    s = seq(1)
    lookup.begin(s)
    context = list(range(100)) + [10, 11]
    assert lookup.propose(s, context, 4).tokens == (12, 13, 14, 15)
    before = len(lookup._groups[1].index)
    context += [12, 13]
    lookup.propose(s, context, 4)
    assert len(lookup._groups[1].index) - before <= 2 * (lookup.max_n - lookup.min_n + 1)
    assert lookup.propose(s, [7, 8], 4) is None or True


def test_a_sibling_ahead_drafts_for_the_one_behind():
    lookup = PromptLookup()
    a, b = seq(1, group=9), seq(2, group=9)
    lookup.begin(a)
    lookup.begin(b)
    prompt = [100, 101, 102]
    ahead = [*prompt, 40, 41, 42, 43, 44, 45]
    lookup.propose(a, ahead, 1)  # a has entered its tokens
    assert lookup.propose(b, [*prompt, 40, 41], 3).tokens == (42, 43, 44)
    lookup.end(a, ahead)
    lookup.end(b, prompt)
    assert not lookup._groups


def test_a_member_joining_after_the_others_ended_drafts_from_their_texts():
    lookup = PromptLookup()
    first = seq(1, group=9)
    lookup.begin(first)
    prompt = [100, 101, 102]
    answer = [*prompt, 40, 41, 42, 43, 44, 45]
    lookup.propose(first, answer[:-1], 1)
    lookup.end(first, answer)  # the end hands over the whole text, its last token too
    assert not lookup._groups
    late = seq(2, group=9)
    lookup.begin(late)
    assert lookup.propose(late, [*prompt, 40, 41], 4).tokens == (42, 43, 44, 45)
    lookup.end(late, prompt)


def test_only_the_last_few_ended_groups_are_kept():
    from node.speculative.lookup import RETAINED_GROUPS

    lookup = PromptLookup()
    for group in range(RETAINED_GROUPS + 3):
        member = seq(group + 1, group=group)
        lookup.begin(member)
        lookup.propose(member, [7, 8, 9, 7, 8], 2)
        lookup.end(member, [7, 8, 9, 7, 8])
    assert list(lookup._ended) == list(range(3, RETAINED_GROUPS + 3))
    late = seq(99, group=0)  # its group is gone: it starts a new index
    lookup.begin(late)
    assert lookup.propose(late, [7, 8], 2) is None
    lookup.end(late, [7, 8])


def test_nothing_to_match_gives_no_draft():
    lookup = PromptLookup()
    s = seq(1)
    lookup.begin(s)
    assert lookup.propose(s, list(range(50)), 8) is None


def test_palimpsest_drafts_a_past_generation_and_its_length_follows_the_match():
    pal = Palimpsest()
    past = list(range(1000, 1060))
    pal.add(past)
    pal.ingest()
    s = seq(1)
    # a 3-token match: at most 4 x 3 tokens
    short = pal.propose(s, [7, 1010, 1011, 1012], 64)
    assert short is not None and short.tokens == tuple(range(1013, 1025))
    # a 20-token match: the whole remaining continuation up to k
    long = pal.propose(s, list(range(1000, 1020)), 30)
    assert long is not None and long.tokens == tuple(range(1020, 1050))


def test_palimpsest_prunes_disputed_branches_and_follows_the_frequent_one():
    pal = Palimpsest()
    for tail in ([50, 51, 52, 0], [50, 51, 52, 1], [60, 61, 62]):
        pal.add([1, 2, 3, 4, *tail])
    pal.ingest()
    # same 4-token match in three streams: 50 wins 2 to 1 (2/3 kept), then the two agree
    assert pal.continuation([1, 2, 3, 4], 3) == (50, 51, 52)
    for tail in ([70], [71], [72], [73]):
        pal.add([9, 8, 7, 6, 5, *tail, 0])
    pal.ingest()
    assert pal.continuation([9, 8, 7, 6, 5], 8) == ()  # four-way split: under PRUNE at once


def test_palimpsest_follows_the_newest_of_equally_long_matches():
    """A greedy answer and then a sampled one to the same prompt: the sampled request sent again
    drafts its own earlier text, not the greedy one (the draft follows the stream written last)."""
    pal = Palimpsest()
    prompt = [1, 2, 3, 4, 5, 6]
    pal.add([*prompt, 40, 41, 42, 43])   # the greedy answer, first
    pal.add([*prompt, 40, 51, 52, 53])   # the sampled answer, later: parts from it at once
    pal.ingest()
    draft = pal.propose(DraftSeq(1, 1, tuple(prompt), True), prompt, 4)
    assert draft is not None and draft.tokens[:2] == (40, 51) and draft.match == len(prompt)


def test_palimpsest_replays_a_past_answer_to_the_same_prompt_past_a_disputed_vote():
    """A past answer to the same prompt tail, agreeing with all the sequence wrote, is drafted as
    a replay even where other streams holding the same text part from it (a paragraph copied
    by one request and quoted by another); another prompt, or an answer that has parted from
    the stored one, gets the vote's draft."""
    pal = Palimpsest(context_tokens=4)
    paragraph = list(range(200, 230))
    rewrite, quote = [90, 91, 92, 93, 94, 95], [80, 81, 82, 83, 84, 85]
    pal.end(seq(1, prompt=rewrite), [*rewrite, *paragraph, 7, 7])     # the copy goes on: 7, 7
    pal.end(seq(2, prompt=quote), [*quote, *paragraph[:20], 9, 9])    # the quote ends: 9, 9
    pal.end(seq(3, prompt=[70, 71, 72, 73]), [70, 71, 72, 73, *paragraph[:20], 5, 5])
    pal.ingest()
    wrote = paragraph[:12]
    again = pal.propose(seq(4, prompt=rewrite), [*rewrite, *wrote], 16)
    assert again is not None and again.replay and again.tokens == tuple(paragraph[12:28])
    assert again.match == 4 + len(wrote)  # the prompt's tail as streams keep it, and all it wrote
    voted = pal.propose(seq(5, prompt=[60, 61, 62, 63]), [60, 61, 62, 63, *wrote], 16)
    assert voted is not None and not voted.replay and voted.tokens[:8] == tuple(paragraph[12:20])
    assert voted.tokens[8:10] != tuple(paragraph[20:22])  # the three streams part there: the vote is no replay
    parted = pal.propose(seq(6, prompt=rewrite), [*rewrite, *wrote[:11], 201], 16)  # its last token differs
    assert parted is None or not parted.replay
    short = Palimpsest()  # a prompt shorter than the tail streams keep: the stream begins with all of it
    short.end(seq(7, prompt=[1, 2, 3]), [1, 2, 3, 40, 41, 42])
    short.add([9, 1, 2, 3, 50, 51])  # the same three tokens inside a longer prompt
    short.ingest()
    draft = short.propose(seq(8, prompt=[1, 2, 3]), [1, 2, 3], 3)
    assert draft is not None and draft.replay and draft.tokens == (40, 41, 42)


def test_palimpsest_is_bounded_and_deduplicates():
    pal = Palimpsest(max_tokens=100)
    for i in range(20):
        pal.add([i, i + 1, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7, i + 8, i + 9])
    pal.add([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])  # already there... but evicted since
    pal.ingest(budget=10_000)
    stats = pal.stats()
    assert stats.tokens <= 100 and stats.evicted_streams >= 10
    assert all(len(chain) for chain in pal._index.values())
    pal2 = Palimpsest()
    pal2.add([1, 2, 3, 4, 5])
    pal2.add([1, 2, 3, 4, 5])
    pal2.ingest()
    assert pal2.stats().streams == 1


def test_palimpsest_is_fed_from_any_thread_and_ingests_a_bounded_amount():
    pal = Palimpsest()
    threads = [threading.Thread(target=lambda i=i: [pal.add([i, j, j + 1, j + 2, j + 3]) for j in range(100)])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pal.stats().pending == 400
    assert pal.ingest(budget=50) <= 55
    pal.ingest(budget=10_000)
    assert pal.stats().streams == 400


def test_palimpsest_takes_a_finished_sequence_with_its_prompt_tail():
    pal = Palimpsest(context_tokens=4)
    s = seq(1, prompt=range(100))
    pal.end(s, [*range(100), 500, 501, 502])
    pal.ingest()
    assert pal.continuation([97, 98, 99], 3) == (500, 501, 502)


def test_lookup_drafts_a_loop_past_the_end_of_the_context():
    """The newest occurrence of a run's n-gram ends a token back: what followed it is one token.
    A text in a loop goes on around it, a whole draft long."""
    lookup = PromptLookup()
    s = seq(1, [5, 6])
    lookup.begin(s)
    zeros = [5, 6, 1, 0, 0, 0, 0, 0, 0, 0]
    draft = lookup.propose(s, zeros, 8)
    assert draft is not None and draft.tokens == (0,) * 8 and draft.echo
    phrase = [5, 6, 7, 8, 9, 7, 8, 9, 7, 8]  # 7 8 9 said again and again: the next is 9
    t = seq(2, [5, 6])
    lookup.begin(t)
    assert lookup.propose(t, phrase, 5).tokens == (9, 7, 8, 9, 7)
    # an occurrence far enough back drafts what followed it, as before
    u = seq(3, [5, 6])
    lookup.begin(u)
    assert lookup.propose(u, [5, 6, 7, 8, 1, 2, 3, 4, 7, 8], 3).tokens == (1, 2, 3)
