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


# a document in lower case, and an answer that writes its values in Title Case or UPPER CASE
RECASE_PIECES = {40: b"Joined as", 41: b" senior", 42: b" accounts", 43: b" clerk", 44: b" in", 45: b" finance",
                 46: b".\n", 47: b"Next", 10: b'{"', 11: b"job", 12: b'":"', 50: b"Senior", 51: b"SENIOR",
                 52: b"Sen", 53: b"SeNior"}
RECASE_PROMPT = (40, 41, 42, 43, 44, 45, 46, 47)
RECASE_TOKENS = {" Accounts": 60, " Clerk": 61, " In": 62, " Finance": 63, ".": 64, " ACCOUNTS": 70, " CLERK": 71,
                 "ior": 80}


def recase() -> tuple[DocumentQuote, DraftSeq, list[str]]:
    import re

    asked: list[str] = []

    def tokenize(text: str) -> list[int]:
        asked.append(text)
        return [RECASE_TOKENS.get(word, 99) for word in re.findall(r"\s?\w+|[^\w\s]", text)]

    source = DocumentQuote()
    source.bind(lambda token: RECASE_PIECES[token], tokenize)
    seq = DraftSeq(1, 1, RECASE_PROMPT, False, grammar=Grammar())
    source.begin(seq)
    return source, seq, asked


def test_a_value_written_in_title_case_goes_on_with_the_documents_words_in_title_case():
    source, seq, asked = recase()
    draft = source.propose(seq, [*RECASE_PROMPT, 10, 11, 12, 50], 3)  # {"job":"Senior
    assert draft is not None and draft.tokens == (60, 61, 62) and draft.source == "grammar.quote"
    assert asked == [" Accounts Clerk In Finance."]  # to the end of the document's line
    again = source.propose(seq, [*RECASE_PROMPT, 10, 11, 12, 50], 5)
    assert again is not None and again.tokens == (60, 61, 62, 63, 64) and len(asked) == 1  # tokenized once


def test_upper_case_and_a_word_under_way_are_kept_as_the_answer_writes_them():
    source, seq, asked = recase()
    assert source.propose(seq, [*RECASE_PROMPT, 10, 11, 12, 51], 2).tokens == (70, 71)  # SENIOR ACCOUNTS CLERK
    inside, seq2, asked2 = recase()
    assert inside.propose(seq2, [*RECASE_PROMPT, 10, 11, 12, 52], 2).tokens == (80, 60)  # "Sen" + "ior Accounts"
    assert asked2 == ["ior Accounts Clerk In Finance."]


def test_a_case_that_is_none_of_the_three_drafts_nothing():
    source, seq, asked = recase()
    assert source.propose(seq, [*RECASE_PROMPT, 10, 11, 12, 53], 3) is None  # SeNior
    assert asked == []
