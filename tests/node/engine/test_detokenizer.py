"""Table tests for incremental UTF-8 decoding and stop-string holdback."""

from __future__ import annotations

import pytest

from node.engine.detokenizer import IncrementalDetokenizer, StopMatcher


@pytest.mark.parametrize(
    ("pieces", "outputs"),
    [
        ([b"ab", b"c"], ["ab", "c"]),
        # U+20AC (euro sign) split over three single-byte tokens
        ([b"x\xe2", b"\x82", b"\xacy"], ["x", "", "\u20acy"]),
        # a 4-byte emoji split 1 + 3
        ([b"\xf0", b"\x9f\x98\x80"], ["", "\U0001F600"]),
        # invalid byte in the middle: replaced, never raises
        ([b"a\xff", b"b"], ["a\ufffd", "b"]),
    ],
)
def test_never_emits_half_a_character(pieces, outputs):
    detok = IncrementalDetokenizer()
    assert [detok.feed(p) for p in pieces] == outputs
    assert detok.flush() == ""


def test_flush_replaces_an_unfinished_character():
    detok = IncrementalDetokenizer()
    assert detok.feed(b"ok\xe2\x82") == "ok"
    assert detok.flush() == "\ufffd"


@pytest.mark.parametrize(
    ("stops", "chunks", "sent", "stopped"),
    [
        ((), ["Hello", " world"], ["Hello", " world"], False),
        # the stop string spans three chunks: nothing of it reaches the client
        (("END",), ["abc E", "N", "D tail"], ["abc ", "", ""], True),
        # a false start is released as soon as it stops matching
        (("END",), ["abc E", "x"], ["abc ", "Ex"], False),
        # earliest of several stop strings wins
        (("\n\n", "ab"), ["xa", "b\n\n"], ["x", ""], True),
        # the stop string inside one chunk cuts the chunk
        (("###",), ["one### two"], ["one"], True),
        # a partial match of one stop is held while another completes earlier
        (("abcd", "bc"), ["ab", "c"], ["", "a"], True),
    ],
)
def test_stop_strings_are_held_back_and_cut(stops, chunks, sent, stopped):
    matcher = StopMatcher(stops)
    scans = [matcher.feed(c) for c in chunks]
    assert [s.text for s in scans] == sent
    assert scans[-1].stopped is stopped


@pytest.mark.parametrize("stops, chunks, matched", [
    (("END",), ["abc E", "ND"], "END"),
    (("\n\n", "ab"), ["xa", "b\n\n"], "ab"),        # the earliest in the text, not the first listed
    (("abcd", "bc"), ["ab", "c"], "bc"),
    (("END",), ["abc", "def"], None),
])
def test_the_stop_string_that_ended_the_text_is_named(stops, chunks, matched):
    matcher = StopMatcher(stops)
    scans = [matcher.feed(c) for c in chunks]
    assert scans[-1].matched == matched and all(scan.matched is None for scan in scans[:-1])


def test_flush_releases_held_text_when_generation_ends_otherwise():
    matcher = StopMatcher(["</answer>"])
    assert matcher.feed("42 </ans").text == "42 "
    assert matcher.held == "</ans"
    assert matcher.flush() == "</ans"
