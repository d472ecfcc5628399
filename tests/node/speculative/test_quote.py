"""The `grammar.quote` source on a table of pieces: a string value's rest read from the prompt's
text by characters (node/speculative/quote.py). The real model's extraction with it is in
tests/node/speculative/test_quote_engine.py."""

from __future__ import annotations

from node.engine.hooks import DraftSeq
from node.speculative.quote import DocumentQuote

# the prompt's tokenization writes a name after a space, the answer's after a quote: other ids
PIECES = {1: b"Contact:", 2: b" Maria", 3: b" Ke", 4: b"ane", 5: b",", 6: b" accounts", 7: b"\n",
          10: b'{"', 11: b"name", 12: b'":"', 13: b"Maria", 14: b'"', 15: b"Mar", 16: b"ia", 17: b"\\",
          18: b"Ma", 19: b"Ke"}
PROMPT = (1, 2, 3, 4, 5, 6, 7)


class Grammar:
    """Admits the first `admits` tokens of any draft."""

    def __init__(self, admits: int = 99) -> None:
        self.admits = admits

    def forced(self):
        return []

    def valid(self, tokens) -> int:
        return min(self.admits, len(tokens))


def quote(grammar=None) -> tuple[DocumentQuote, DraftSeq]:
    source = DocumentQuote()
    source.bind(lambda token: PIECES[token], lambda text: [])
    seq = DraftSeq(1, 1, PROMPT, False, grammar=grammar if grammar is not None else Grammar())
    source.begin(seq)
    return source, seq


def test_a_value_under_way_goes_on_as_the_document_has_it():
    source, seq = quote()
    draft = source.propose(seq, [*PROMPT, 10, 11, 12, 13], 3)  # {"name":"Maria
    assert draft is not None and draft.tokens == (3, 4, 5) and draft.source == "grammar.quote"
    assert draft.match == 1  # one token of the value written
    other, seq2 = quote()
    split = other.propose(seq2, [*PROMPT, 10, 11, 12, 15, 16], 2)  # the same text in two tokens
    assert split is not None and split.tokens == (3, 4) and split.match == 2


def test_nothing_outside_a_string_or_before_enough_of_the_value():
    source, seq = quote()
    assert source.propose(seq, [*PROMPT, 10, 11], 3) is None  # {"name: a key, still open, too short
    assert source.propose(seq, [*PROMPT, 10, 11, 12, 13, 14], 3) is None  # the value is closed
    other, seq2 = quote()
    assert other.propose(seq2, [*PROMPT, 10, 11, 12, 18], 3) is None  # "Ma": fewer than 3 bytes


def test_an_occurrence_must_end_where_a_prompt_token_ends():
    source, seq = quote()
    assert source.propose(seq, [*PROMPT, 10, 11, 12, 13, 3], 2).tokens == (4, 5)  # "Maria Ke": " Ke" ends there
    other, seq2 = quote()
    assert other.propose(seq2, [*PROMPT, 10, 11, 12, 18, 19], 2) is None  # "MaKe": not the document's text
    third, seq3 = quote()
    assert third.propose(seq3, [*PROMPT, 10, 11, 12, 15], 2) is None  # "Mar" ends inside the token " Maria"


def test_an_escaped_quote_does_not_close_the_value():
    source, seq = quote()
    # {"name":"\"Maria: the value is `\"Maria`, still open, and the prompt does not have it
    assert source.propose(seq, [*PROMPT, 10, 11, 12, 17, 14, 13], 2) is None
    assert source._outputs[seq.key].inside
    closed, seq2 = quote()
    # {"name":"\\" then Maria: an escaped backslash, then a quote that closes the value
    assert closed.propose(seq2, [*PROMPT, 10, 11, 12, 17, 17, 14, 13], 2) is None
    assert not closed._outputs[seq2.key].inside


def test_the_grammar_cuts_the_draft_and_no_grammar_no_draft():
    source, seq = quote(Grammar(admits=1))
    assert source.propose(seq, [*PROMPT, 10, 11, 12, 13], 3).tokens == (3,)
    free = DocumentQuote()
    free.bind(lambda token: PIECES[token], lambda text: [])
    plain = DraftSeq(2, 2, PROMPT, False)
    free.begin(plain)
    assert free.propose(plain, [*PROMPT, 10, 11, 12, 13], 3) is None
    source.end(seq, [])
    assert source.propose(seq, [*PROMPT, 10, 11, 12, 13], 3) is None  # its state is gone
