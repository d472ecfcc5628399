"""The Conclave's vote on table cases: answer keys, majority, plurality, the ROUGE-L medoid."""

from __future__ import annotations

import pytest

from node.serving.conclave.vote import answer_key, decide, early, majority, medoid, rouge_l, words


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
