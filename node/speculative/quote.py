"""The `grammar.quote` source: a string value's rest, read from the request's text by characters.

An extraction under a schema copies values out of the document: `"name":"Maria Keane"` from
"Contact: Maria Keane, accounts". Prompt lookup matches tokens, and the value's first token is
rarely the document's: after a quote the tokenizer writes `Maria`, after a space ` Maria`, two
ids, so no n-gram of the answer is in the prompt until the copy is nearly over, and the
grammar's copy source (node/speculative/format.py) follows only forced keys. This source
matches text instead: inside a string the output has opened (an odd count of unescaped quotes),
the value written so far, at least MIN_BYTES of it, is looked for in the prompt's text, the
last occurrence that ends where a prompt token ends; the prompt's tokens from there are the
draft, as far as the grammar admits them. The target's choice decides what is kept, so the
output is constrained decoding's whatever is proposed.

A value is often written in another case than the document's: "senior accounts clerk in the
finance department" becomes `"job_title":"Senior Accounts Clerk"`. Where the value so far is
not in the prompt as written but is with ASCII letters folded, and it is written in Title Case,
UPPER CASE or lower case where the document's text differs, the document's text that follows
(to the end of its line, at most RECASED_BYTES) is put in that case and tokenized as the
draft: each of "Senior" and " Accounts Clerk" took a step of its own before, with nothing to
draft after the first word. A continuation inside a word keeps that word's rest as it is.

Per sequence: the prompt's text with the byte offset each token starts at (made at `begin`,
for constrained sequences only) and the output's text with where its open string began, both
kept up to date token by token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.engine.hooks import Draft, DraftSeq

MIN_BYTES = 3  # a value this long is looked for (one letter would match anywhere)
RECASED_BYTES = 48  # the document's text after a value written in another case, re-cased as a draft
QUOTE, ESCAPE = ord('"'), ord("\\")


@dataclass(slots=True)
class _Prompt:
    text: bytes
    starts: dict[int, int]  # byte offset where a prompt token starts -> its index
    tokens: tuple[int, ...]
    folded: bytes = b""     # the text with ASCII letters in lower case (the same offsets)


@dataclass(slots=True)
class _Output:
    seen: int                               # context tokens read so far
    data: bytearray = field(default_factory=bytearray)
    inside: bool = False                    # an open string
    escaped: bool = False                   # the last byte read was a backslash inside a string
    opened: int = 0                         # where in `data` the open string's text begins
    opened_token: int = 0                   # the context index of the first token after its quote
    recased: tuple[int, str, tuple[int, ...]] | None = None  # the last re-cased draft: (its text's offset, case, tokens)


class DocumentQuote:
    """Implements node.speculative.source.DraftSource; needs the vocabulary's pieces (`bind`)."""

    def __init__(self) -> None:
        self.name = "grammar.quote"
        self.cost_per_token = 0.0
        self.prior = 0.6
        self._piece: Callable[[int], bytes] | None = None
        self._tokenize: Callable[[str], list[int]] | None = None
        self._pieces: dict[int, bytes] = {}  # the vocabulary's pieces met so far (a prompt repeats most)
        self._prompts: dict[int, _Prompt] = {}
        self._outputs: dict[int, _Output] = {}

    def bind(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self._piece, self._tokenize = piece, tokenize
        self._pieces.clear()

    def begin(self, seq: DraftSeq) -> None:
        if seq.grammar is None or self._piece is None:
            return
        text, starts = bytearray(), {}
        for i, token in enumerate(seq.prompt):
            starts[len(text)] = i
            text += self._piece_of(token)
        self._prompts[seq.key] = _Prompt(bytes(text), starts, seq.prompt, bytes(text).lower())
        self._outputs[seq.key] = _Output(seen=len(seq.prompt))

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        prompt, out = self._prompts.get(seq.key), self._outputs.get(seq.key)
        if prompt is None or out is None or seq.grammar is None or self._piece is None:
            return None
        self._read(out, context)
        value = bytes(out.data[out.opened:]) if out.inside else b""
        if len(value) < MIN_BYTES:
            return None
        start = _aligned_end(prompt, value)
        tokens = prompt.tokens[start:start + k] if start is not None else self._recased(prompt, out, value)[:k]
        tokens = tokens[:seq.grammar.valid(tokens)]
        return Draft(tokens, self.name, match=len(context) - out.opened_token) if tokens else None

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        self._prompts.pop(seq.key, None)
        self._outputs.pop(seq.key, None)

    def _recased(self, prompt: _Prompt, out: _Output, value: bytes) -> tuple[int, ...]:
        """The document's text after the value, in the case the value is written in, tokenized;
        () where the value is not in the document in another case."""
        at = prompt.folded.rfind(value.lower())
        if at < 0 or self._tokenize is None:
            return ()
        case = _case(value, prompt.text[at:at + len(value)])
        if case is None:
            return ()
        end = at + len(value)
        if out.recased is not None and out.recased[:2] == (end, case):
            return out.recased[2]
        rest = prompt.text[end:end + RECASED_BYTES].split(b"\n", 1)[0].decode("utf-8", "ignore")
        inside_word = value[-1:].isalnum() and rest[:1].isalnum()
        tokens = tuple(self._tokenize(_in_case(rest, case, inside_word))) if rest else ()
        out.recased = (end, case, tokens)
        return tokens

    def _read(self, out: _Output, context: Sequence[int]) -> None:
        """The output's new tokens into its text, following its strings' quotes."""
        if out.seen > len(context):  # the context went back (never in the engine): read again
            out.seen, out.data, out.inside, out.escaped = len(context), bytearray(), False, False
        for index in range(out.seen, len(context)):
            for byte in self._piece_of(int(context[index])):
                out.data.append(byte)
                if out.escaped:
                    out.escaped = False
                elif out.inside and byte == ESCAPE:
                    out.escaped = True
                elif byte == QUOTE:
                    out.inside = not out.inside
                    out.opened, out.opened_token = len(out.data), index + 1
        out.seen = len(context)

    def _piece_of(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            assert self._piece is not None
            piece = self._pieces[token] = self._piece(token)
        return piece


def _aligned_end(prompt: _Prompt, value: bytes) -> int | None:
    """The index of the prompt token that starts where the last occurrence of `value` in the
    prompt's text ends on a token boundary (None: no such occurrence)."""
    end = len(prompt.text)
    while True:
        at = prompt.text.rfind(value, 0, end)
        if at < 0:
            return None
        start = prompt.starts.get(at + len(value))
        if start is not None:
            return start
        end = at + len(value) - 1


def _case(value: bytes, original: bytes) -> str | None:
    """How `value` re-cases the document's `original` (the same letters folded): "upper",
    "title" or "lower"; None where it is the document's own case or none of these."""
    if value == original or not any(c.isalpha() for c in value.decode("utf-8", "ignore")):
        return None
    letters = [c for c in value.decode("utf-8", "ignore") if c.isascii() and c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return "upper"
    if all(c.islower() for c in letters):
        return "lower"
    words = [w for w in value.decode("utf-8", "ignore").split() if w[:1].isalpha()]
    if words and all(w[0].isupper() and not any(c.isupper() for c in w[1:]) for w in words):
        return "title"
    return None


def _in_case(text: str, case: str, inside_word: bool) -> str:
    """`text` in `case`; under "title", a word's first letter upper and the rest as the text has
    them, the word the value stopped inside (`inside_word`) left as it is."""
    if case == "upper":
        return text.upper()
    if case == "lower":
        return text.lower()
    out, start = [], not inside_word
    for c in text:
        out.append(c.upper() if start and c.isalpha() else c)
        start = c.isspace() or (start and not c.isalnum())
    return "".join(out)
