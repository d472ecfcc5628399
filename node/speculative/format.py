"""Il Suggeritore: the form of the output as a draft source.

Under a grammar (`grammar`, and `grammar.copy` which goes on from the request's own text; and
`grammar.quote`, a string value's rest read from the request's text by characters,
node/speculative/quote.py):
the tokens the grammar forces next (keys, braces, quotes, commas,
the rest of an enum value only one option still fits), in the grammar engine's own
tokenization (node/engine/grammar.py `Matcher.forced`). They are proposed as a draft and
verified in the batch like any other: the target's masked choice decides, so a forced token
the model would tokenize differently is simply not kept, and the output is exactly what
constrained decoding without drafts gives. Where the mask admits one token alone, the engine
has already taken it without logits (jump-forward, node/engine/scheduler.py `_jump`), so this
source drafts forced tokens only where the engine does not jump (a request asking for logprobs,
a run past the engine's per-step bound).

Without a grammar, form rules read the last lines of the text (prompt tail and output), each
its own source so the controller measures and switches each one separately:
- `form.list`      after a list line, the next marker: `3. x\\n` -> `4.`, `- x\\n` -> `-`;
- `form.list_end`  inside a list item at least as long as the shortest earlier one: the
                   line's end and the next marker (`\\n4.`);
- `form.table`     markdown tables: a row's leading pipe, the separator row under a header,
                   a row's closing pipe and the next row's opening one;
- `form.indent`    after a newline in code: the previous line's indentation (one level
                   deeper after a line ending in `:` or `{`);
- `form.close`     a string just closed inside open brackets: the closing brackets;
- `form.prefix`    a line prefix the text repeats (`Q: ... A: ...`): the prefix that
                   followed the previous line's prefix the last time.
Rules need the vocabulary (`bind`: the token pieces and a tokenizer); unbound they propose
nothing. Text is tracked per sequence incrementally: each step adds only the new tokens'
pieces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from node.engine.hooks import Draft, DraftSeq
from node.speculative.lookup import PromptLookup
from node.speculative.quote import DocumentQuote
from node.speculative.source import DraftSource

PROMPT_TAIL = 256     # prompt tokens read at begin (few-shot lists, tables and Q/A patterns)
TEXT_BYTES = 4096     # tail of the text kept per sequence
LINES = 24            # lines a rule looks back at
FORCED_PRIOR = 0.95   # what the controller assumes of a forced token before it has seen any
RULE_PRIOR = 0.7      # and of a form rule: tried before prompt lookup's learned estimates win

_NUMBERED = re.compile(r"^(\s*)(\d{1,4})([.)])(\s+)(\S.*)?$")
_BULLET = re.compile(r"^(\s*)([-*+•])(\s+)(\S.*)?$")
_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9 ]{0,15}:)")
_OPEN = {"(": ")", "[": "]", "{": "}"}


class GrammarForced:
    """The `grammar` source: tokens the sequence's grammar forces next. As `grammar.copy` (with
    a prompt lookup to read from), the forced tokens followed by what followed them in the
    request's own text, as far as the grammar admits it: the keys come from the schema, the
    values of an extraction from the document. Two sources, so each one's acceptance is its own
    (forced tokens are nearly always kept, copies less often)."""

    def __init__(self, lookup: PromptLookup | None = None) -> None:
        self.lookup = lookup
        self.cost_per_token = 0.0
        self.name = "grammar.copy" if lookup is not None else "grammar"
        self.prior = 0.6 if lookup is not None else FORCED_PRIOR

    def begin(self, seq: DraftSeq) -> None:
        pass

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        if seq.grammar is None:
            return None
        tokens = tuple(seq.grammar.forced()[:k])
        if self.lookup is not None and len(tokens) < k:
            tail = (*context[-self.lookup.max_n:], *tokens)
            more = self.lookup.peek(seq, tail, k - len(tokens))
            if more:
                joined = tokens + more
                tokens = joined[:seq.grammar.valid(joined)]
        return Draft(tokens, self.name) if tokens else None

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        pass


@dataclass(slots=True)
class _Text:
    data: bytearray = field(default_factory=bytearray)
    seen: int = 0            # context tokens whose pieces are in data
    at: int = -1             # context length the lines were computed for
    lines: list[str] = field(default_factory=list)


class TextTracker:
    """The tail of each sequence's text as lines, kept up to date token by token."""

    def __init__(self) -> None:
        self.piece: Callable[[int], bytes] | None = None
        self.tokenize: Callable[[str], list[int]] | None = None
        self._texts: dict[int, _Text] = {}
        self._tokens: dict[str, tuple[int, ...]] = {}

    def bind(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self.piece, self.tokenize = piece, tokenize

    def begin(self, seq: DraftSeq) -> None:
        start = max(0, len(seq.prompt) - PROMPT_TAIL)
        self._texts[seq.key] = _Text(seen=start)

    def end(self, seq: DraftSeq) -> None:
        self._texts.pop(seq.key, None)

    def lines(self, seq: DraftSeq, context: Sequence[int]) -> list[str] | None:
        """The last lines of the text; the last one is the line being written ('' after a newline)."""
        text, piece = self._texts.get(seq.key), self.piece
        if text is None or piece is None:
            return None
        if text.at != len(context):
            if text.seen > len(context):
                text.seen = len(context)
            for token in context[text.seen:]:
                text.data += piece(token)
            text.seen = len(context)
            if len(text.data) > TEXT_BYTES:
                del text.data[:len(text.data) - TEXT_BYTES]
            text.lines = text.data.decode("utf-8", "ignore").split("\n")[-LINES:]
            text.at = len(context)
        return text.lines

    def tokens(self, text: str) -> tuple[int, ...]:
        cached = self._tokens.get(text)
        if cached is None:
            assert self.tokenize is not None
            cached = tuple(self.tokenize(text))
            if len(self._tokens) < 4096:
                self._tokens[text] = cached
        return cached


def next_marker(line: str) -> str | None:
    """The marker of the list line after `line` (None: not a list line)."""
    numbered = _NUMBERED.match(line)
    if numbered:
        indent, number, sep, _, _ = numbered.groups()
        return f"{indent}{int(number) + 1}{sep}"
    bullet = _BULLET.match(line)
    if bullet:
        return f"{bullet.group(1)}{bullet.group(2)}"
    return None


def rule_list(lines: list[str]) -> str | None:
    if len(lines) < 2 or lines[-1] != "":
        return None
    return next_marker(lines[-2])


def rule_list_end(lines: list[str]) -> str | None:
    """Inside an item at least as long as the shortest earlier item: its end and the next marker."""
    line = lines[-1]
    match = _NUMBERED.match(line) or _BULLET.match(line)
    if match is None or not match.groups()[-1]:
        return None
    earlier = [m.groups()[-1] for m in (_NUMBERED.match(x) or _BULLET.match(x) for x in lines[:-1]) if m]
    if any(earlier) and len(match.groups()[-1]) < min(len(item) for item in earlier if item):
        return None
    marker = next_marker(line)
    return "\n" + marker if marker else None


def rule_table(lines: list[str]) -> str | None:
    if len(lines) < 2:
        return None
    line, previous = lines[-1], lines[-2].rstrip()
    if not (previous.startswith("|") and previous.endswith("|")):
        return None
    cells = previous.count("|") - 1
    if line == "":
        before = lines[-3].strip() if len(lines) >= 3 else ""
        is_separator = set(previous) <= set("|-: ")
        if not is_separator and not before.startswith("|"):  # a header row: the separator follows
            return "|" + "---|" * cells
        return "|"
    if line.startswith("|") and line.count("|") == cells and not line.endswith(("|", " ")):
        return " |\n|"
    return None


def rule_indent(lines: list[str]) -> str | None:
    if len(lines) < 2 or lines[-1] != "":
        return None
    previous = lines[-2]
    indent = previous[:len(previous) - len(previous.lstrip(" \t"))]
    if previous.rstrip().endswith((":", "{")):
        indent += "\t" if indent.startswith("\t") else "    "
    return indent or None


def rule_close(lines: list[str]) -> str | None:
    line = lines[-1]
    if not line or line[-1] not in "\"'" or line.count(line[-1]) % 2:
        return None
    stack: list[str] = []
    quote = ""
    for ch in line:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
    return "".join(reversed(stack)) or None


def rule_prefix(lines: list[str]) -> str | None:
    if len(lines) < 3 or lines[-1] != "":
        return None
    current = _PREFIX.match(lines[-2])
    if current is None:
        return None
    for i in range(len(lines) - 3, 0, -1):
        earlier = _PREFIX.match(lines[i - 1])
        if earlier is not None and earlier.group(1) == current.group(1):
            following = _PREFIX.match(lines[i])
            return following.group(1) if following is not None else None
    return None


RULES: dict[str, Callable[[list[str]], str | None]] = {
    "form.list": rule_list, "form.list_end": rule_list_end, "form.table": rule_table,
    "form.indent": rule_indent, "form.close": rule_close, "form.prefix": rule_prefix,
}


class FormRule:
    """One form rule as a draft source (its own name, so its acceptance is its own)."""

    def __init__(self, name: str, rule: Callable[[list[str]], str | None], tracker: TextTracker,
                 owner: bool = False) -> None:
        self.name = name
        self.cost_per_token = 0.0
        self.prior = RULE_PRIOR
        self._rule = rule
        self._tracker = tracker
        self._owner = owner  # the first rule of a set begins and ends the shared text

    def bind(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self._tracker.bind(piece, tokenize)

    def begin(self, seq: DraftSeq) -> None:
        if self._owner:
            self._tracker.begin(seq)

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        if seq.grammar is not None:
            return None  # under a grammar the grammar knows better
        lines = self._tracker.lines(seq, context)
        if not lines:
            return None
        text = self._rule(lines)
        if not text:
            return None
        tokens = self._tracker.tokens(text)[:k]
        return Draft(tokens, self.name) if tokens else None

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        if self._owner:
            self._tracker.end(seq)


class Suggeritore:
    """Every source of Il Suggeritore, sharing one text tracker; `bind` gives it the vocabulary."""

    def __init__(self, rules: Sequence[str] | None = None, *, lookup: PromptLookup | None = None) -> None:
        self.tracker = TextTracker()
        names = list(RULES) if rules is None else [name for name in RULES if name in rules]
        self.rules = [FormRule(name, RULES[name], self.tracker, owner=i == 0) for i, name in enumerate(names)]
        self.grammar: list[DraftSource] = [GrammarForced(), *([GrammarForced(lookup)] if lookup is not None else []),
                                           DocumentQuote()]

    def bind(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self.tracker.bind(piece, tokenize)

    def sources(self) -> list[DraftSource]:
        return [*self.grammar, *self.rules]
