"""The Conclave's vote on table cases: answer keys, majority, plurality, the ROUGE-L medoid, and a
plurality settled before everyone finished, checked against every way the rest could end."""

from __future__ import annotations

import pytest

import itertools

from node.serving.conclave.vote import answer_key, decide, early, majority, medoid, rouge_l, settled, words


@pytest.mark.parametrize("text, key", [
    ("The sum is 42.", "number:42"),
    ("First 3, then 7, so 10", "number:10"),
    ("1,000", "number:1000"),
    ("1000.00", "number:1000"),
    ("-0", "number:0"),
    ("x = -12.50", "number:-12.5"),
    ("0.5", "number:0.5"),
    ("  Paris. ", "text:paris"),
    ("PARIS!!", "text:paris"),
    ("Answer:  New   York", "text:new york"),
    ("I think so.\nThe answer is Blue", "text:blue"),
    ('{"b": 1, "a": [1, 2]}', 'json:{"a":[1,2],"b":1}'),
    ('{ "a" : [1,2], "b":1 }', 'json:{"a":[1,2],"b":1}'),
    ('Here it is:\n```json\n{"name": "x"}\n```', 'json:{"name":"x"}'),
    ("{not json", "text:not json"),
    ("A long sentence without any digits that goes on and on about rivers and hills and valleys", None),
    ("", None),
])
def test_answer_keys(text, key):
    assert answer_key(text) == key


def test_the_same_answer_in_other_words_agrees():
    assert answer_key("So 12 + 30 = 42") == answer_key("42") == answer_key("It is 42.0")
    assert answer_key("positive") == answer_key("Positive.") == answer_key("  POSITIVE ")


@pytest.mark.parametrize("n, votes", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (16, 9)])
def test_absolute_majority_of_n(n, votes):
    assert majority(n) == votes


def test_majority_of_n_stops_before_everyone_finished():
    keys = {0: "number:7", 1: "number:7", 3: "number:7"}
    verdict = early(keys, 5)
    assert verdict is not None and verdict.winner == 0 and verdict.consensus == 3 and verdict.method == "majority"
    assert early({0: "number:7", 1: "number:7", 2: "number:8"}, 5) is None  # 2 of 5 is no majority


@pytest.mark.parametrize("texts, n, winner, method, consensus", [
    ({0: "42", 1: "42", 2: "42", 3: "41", 4: "40"}, 5, 0, "majority", 3),
    ({0: "41", 1: "42", 2: "42", 3: "40", 4: "39"}, 5, 1, "plurality", 2),
    ({0: "1", 1: "2", 2: "1", 3: "2", 4: "3"}, 5, 0, "plurality", 2),  # a tie goes to candidate 0's answer
    ({0: "1", 1: "2", 2: "2", 3: "1", 4: "3"}, 5, 0, "plurality", 2),
    ({0: '{"a": 1}', 1: '{ "a":1 }', 2: '{"a": 2}'}, 3, 0, "majority", 2),
    ({0: "yes", 1: "no", 2: "maybe"}, 3, 0, "medoid", 1),
    ({3: "only this one"}, 5, 3, "single", 1),
])
def test_decide(texts, n, winner, method, consensus):
    verdict = decide(texts, n)
    assert (verdict.winner, verdict.method, verdict.consensus) == (winner, method, consensus)


def test_votes_are_shown_without_their_kind():
    verdict = decide({0: "42", 1: "42", 2: "Paris"}, 3)
    assert dict(verdict.votes) == {"42": 2, "paris": 1}


def test_prose_medoid_is_the_text_closest_to_all_others():
    texts = {
        0: "the river flows north through green hills to the sea",
        1: "the river flows north to the cold sea past green hills",
        2: "a cat sat quietly on a warm mat in the kitchen",
        3: "the river runs north through the hills to the sea",
    }
    verdict = decide(texts, 4)
    assert verdict.method == "medoid" and verdict.winner in (0, 3)
    assert medoid(list(texts.values())) == verdict.winner
    assert verdict.votes == {}


def test_rouge_l():
    a, b = words("the cat sat on the mat"), words("the cat on the mat")
    assert rouge_l(a, a) == 1.0
    assert rouge_l(a, words("dog")) == 0.0
    assert rouge_l(a, b) == pytest.approx(2 * (5 / 6) * 1.0 / (5 / 6 + 1.0))
    assert rouge_l([], []) == 1.0 and rouge_l(a, []) == 0.0


def test_decide_needs_a_candidate():
    with pytest.raises(ValueError):
        decide({}, 3)


def test_under_a_json_schema_only_parsed_answers_vote():
    cut = '{"ok": true, "score": 0.5'  # two answers cut by max_tokens: their number is no vote
    assert answer_key(cut) == "number:0.5" and answer_key(cut, json_only=True) is None
    texts = {0: cut, 1: '{"ok": false}', 2: cut}
    assert decide(texts, 3).winner == 0  # plain text rules: the cut ones agree on 0.5
    verdict = decide(texts, 3, json_only=True)
    assert (verdict.winner, verdict.method, verdict.votes) == (1, "single", {'{"ok":false}': 1})
    both = decide({0: cut, 1: '{"ok":false}', 2: '{"ok": true}', 3: cut}, 4, json_only=True)
    assert both.winner in (1, 2) and both.method == "medoid"
    assert decide({0: cut, 1: cut + ","}, 2, json_only=True).method == "medoid"  # nothing parses: prose rules


PROSE = "a long answer that names no number and ends in a sentence far too long to be a short line"


@pytest.mark.parametrize("keys, pending, winner", [
    ({0: "number:7", 1: "number:7", 2: "number:8", 3: "number:9"}, [4], 0),  # 2 votes; the last can at most tie, and loses it
    ({0: "number:7", 1: "number:8", 2: "number:8", 3: "number:9"}, [4], None),  # 4 giving 7 ties, and 7 has candidate 0
    ({1: "number:7", 2: "number:7", 3: "number:9", 4: "number:8"}, [0], None),  # 0 giving 7 would be the one returned
    ({0: "number:7", 1: "number:7", 2: "number:8"}, [3, 4], None),  # 3 and 4 agreeing on 8 make it a majority
    ({0: "number:7", 1: "number:7", 2: None, 3: None}, [4], 0),
    ({0: "number:7", 1: None, 2: None, 3: None}, [4], None),  # one vote: the medoid may still decide
    ({0: "number:7", 1: "number:7", 2: "number:7", 3: "number:8", 4: "number:9", 5: "number:6"}, [6, 7], 0),
])
def test_a_plurality_no_pending_answer_can_change_is_settled(keys, pending, winner):
    verdict = settled(keys, pending)
    assert (verdict.winner if verdict else None) == winner
    if verdict is not None:
        assert verdict.method == "plurality" and verdict.consensus == sum(1 for k in keys.values() if k == keys[winner])


def _text(key: str | None) -> str:
    return PROSE if key is None else key.split(":", 1)[1]


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_a_settled_verdict_is_what_every_ending_of_the_rest_decides(n):
    """Every state of n candidates (each finished with one of three answers or prose, or pending):
    where `settled` decides, every way the pending ones could end (an answer given, a new one,
    two pending ones agreeing on a new one, prose, or failing) gives `decide` the same winner."""
    answers = ["number:1", "number:2", "number:3", None]
    endings = ["number:1", "number:2", "number:3", "number:8", "number:9", None, "failed"]
    seen = 0
    for states in itertools.product([*answers, "pending"], repeat=n):
        keys = {c: state for c, state in enumerate(states) if state != "pending"}
        pending = [c for c, state in enumerate(states) if state == "pending"]
        verdict = settled(keys, pending)
        if verdict is None:
            continue
        seen += 1
        assert early(keys, n) is None or early(keys, n).winner == verdict.winner
        for ending in itertools.product(endings, repeat=len(pending)):
            texts = {c: _text(k) for c, k in keys.items()}
            texts.update({c: _text(k) for c, k in zip(pending, ending) if k != "failed"})
            assert decide(texts, n).winner == verdict.winner, (keys, pending, ending)
    assert seen > 0
