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

Per sequence: the prompt's text with the byte offset each token starts at (made at `begin`,
for constrained sequences only) and the output's text with where its open string began, both
kept up to date token by token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.engine.hooks import Draft, DraftSeq

MIN_BYTES = 3  # a value this long is looked for (one letter would match anywhere)
QUOTE, ESCAPE = ord('"'), ord("\\")


@dataclass(slots=True)
class _Prompt:
    text: bytes
    starts: dict[int, int]  # byte offset where a prompt token starts -> its index
    tokens: tuple[int, ...]


@dataclass(slots=True)
class _Output:
    seen: int                               # context tokens read so far
    data: bytearray = field(default_factory=bytearray)
    inside: bool = False                    # an open string
    escaped: bool = False                   # the last byte read was a backslash inside a string
    opened: int = 0                         # where in `data` the open string's text begins
    opened_token: int = 0                   # the context index of the first token after its quote


class DocumentQuote:
    """Implements node.speculative.source.DraftSource; needs the vocabulary's pieces (`bind`)."""

    def __init__(self) -> None:
        self.name = "grammar.quote"
        self.cost_per_token = 0.0
        self.prior = 0.6
        self._piece: Callable[[int], bytes] | None = None  # the engine's token_piece, memoised there
        self._prompts: dict[int, _Prompt] = {}
        self._outputs: dict[int, _Output] = {}

    def bind(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self._piece = piece

    def begin(self, seq: DraftSeq) -> None:
        if seq.grammar is None or self._piece is None:
            return
        text, starts = bytearray(), {}
        for i, token in enumerate(seq.prompt):
            starts[len(text)] = i
            text += self._piece(token)
        self._prompts[seq.key] = _Prompt(bytes(text), starts, seq.prompt)
        self._outputs[seq.key] = _Output(seen=len(seq.prompt))

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        prompt, out = self._prompts.get(seq.key), self._outputs.get(seq.key)
        if prompt is None or out is None or seq.grammar is None or self._piece is None:
            return None
        self._read(out, context, self._piece)
        value = bytes(out.data[out.opened:]) if out.inside else b""
        if len(value) < MIN_BYTES:
            return None
        start = _aligned_end(prompt, value)
        if start is None:
            return None
        tokens = prompt.tokens[start:start + k]
        tokens = tokens[:seq.grammar.valid(tokens)]
        return Draft(tokens, self.name, match=len(context) - out.opened_token) if tokens else None

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        self._prompts.pop(seq.key, None)
        self._outputs.pop(seq.key, None)

    def _read(self, out: _Output, context: Sequence[int], piece: Callable[[int], bytes]) -> None:
        """The output's new tokens into its text, following its strings' quotes."""
        if out.seen > len(context):  # the context went back (never in the engine): read again
            out.seen, out.data, out.inside, out.escaped = len(context), bytearray(), False, False
        for index in range(out.seen, len(context)):
            for byte in piece(int(context[index])):
                out.data.append(byte)
                if out.escaped:
                    out.escaped = False
                elif out.inside and byte == ESCAPE:
                    out.escaped = True
                elif byte == QUOTE:
                    out.inside = not out.inside
                    out.opened, out.opened_token = len(out.data), index + 1
        out.seen = len(context)


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
