"""The vote: which candidate's answer the Conclave returns, from the candidates' texts.

Each finished candidate's text becomes an answer key (`answer_key`), the first rule that
applies:
1. the text (or a fenced ```json block in it) parses as JSON: the parsed value, dumped
   canonically (sorted keys), so key order and spacing never split a vote;
2. it holds a number: the last number (thousands separators and a trailing ".0" dropped,
   so "1,000", "1000" and "1000.00" agree);
3. its last non-empty line is short (at most SHORT_WORDS words): that line, casefolded,
   punctuation removed, spacing collapsed, a leading "answer:" dropped;
4. otherwise none: prose, which takes part only in the medoid.
Under a JSON Schema (structured output, tool calls: `json_only`) only rule 1 applies: a text
that does not parse (cut by max_tokens) has no key, so the numbers inside a half-written
object never vote, and once every candidate has finished, the ones that parse are the only
ones the plurality and the medoid choose from (a cut answer wins only when nothing parses).

`decide(keys, n_total)`: an answer held by more than half of the N candidates (absolute
majority of N, not of those finished) wins at once and the others are stopped; once every
candidate has finished, the plurality answer wins if at least 2 candidates gave it (a tie
goes to the answer given by the lowest-numbered candidate, so candidate 0, the unchanged
request, wins ties); otherwise the medoid: the candidate whose text has the highest summed
ROUGE-L F1 against all the others, over lowercased word tokens. The candidate returned for
a winning answer is the lowest-numbered one that gave it.

`settled(keys, pending)`: the plurality's verdict before every candidate finished,
when nothing the pending ones (running or not started) could answer changes it: the leading
answer has 2 votes or more, no pending candidate is numbered below its first (joining it would
change the candidate returned), and no other answer, nor one nobody gave yet, beats it even
with every pending vote (5 candidates: 2 for one answer, 1 each for two others and one still
running). The winner is then the one `decide` would return once they all finished, so the
others are stopped as for a majority.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import orjson

SHORT_WORDS = 8
SHORT_CHARS = 80
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_WORD = re.compile(r"\w+", re.UNICODE)
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
_ANSWER_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*", re.IGNORECASE)


def answer_key(text: str, *, json_only: bool = False) -> str | None:
    """The normalised final answer of a text (see the module docstring), or None for prose;
    `json_only`: the parsed JSON value or None."""
    parsed = _json_value(text)
    if parsed is not None:
        return "json:" + orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    if json_only:
        return None
    numbers = _NUMBER.findall(text)
    if numbers:
        return "number:" + _number(numbers[-1])
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines:
        line = lines[-1]
        if len(line) <= SHORT_CHARS and len(line.split()) <= SHORT_WORDS:
            words = " ".join(_PUNCT.sub(" ", line.casefold()).split())
            words = _ANSWER_PREFIX.sub("", words).strip()
            if words:
                return "text:" + words
    return None


def _json_value(text: str) -> object | None:
    candidates = [text.strip(), *(m.strip() for m in _FENCE.findall(text))]
    for candidate in candidates:
        if not candidate or candidate[0] not in "{[":
            continue
        try:
            return orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
    return None


def _number(raw: str) -> str:
    digits = raw.replace(",", "").lstrip("+")
    if "." in digits:
        digits = digits.rstrip("0").rstrip(".")
    negative = digits.startswith("-")
    digits = digits.lstrip("-").lstrip("0") or "0"
    if digits.startswith("."):
        digits = "0" + digits
    return ("-" if negative and digits != "0" else "") + digits


def display(key: str) -> str:
    """A key without its kind prefix, as clients see it in `votes`."""
    return key.split(":", 1)[1]


def words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def rouge_l(a: Sequence[str], b: Sequence[str]) -> float:
    """ROUGE-L F1 of two token sequences: from their longest common subsequence."""
    if not a or not b:
        return 1.0 if not a and not b else 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def medoid(texts: Sequence[str]) -> int:
    """The index of the text with the highest summed ROUGE-L against the others (lowest on ties)."""
    tokens = [words(text) for text in texts]
    scores = [sum(rouge_l(tokens[i], tokens[j]) for j in range(len(texts)) if j != i) for i in range(len(texts))]
    return max(range(len(texts)), key=lambda i: (scores[i], -i))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the vote decided: the winning candidate and how."""

    winner: int                 # candidate number
    method: str                 # "majority" | "plurality" | "medoid" | "single"
    consensus: int              # candidates that gave the winning answer (1 for a medoid)
    votes: Mapping[str, int] = field(default_factory=dict)  # answer (display form) -> candidates


def majority(n_total: int) -> int:
    """Votes that make an absolute majority of n_total candidates."""
    return n_total // 2 + 1


def tally(keys: Mapping[int, str | None]) -> dict[str, list[int]]:
    """Answer key -> the candidates that gave it, in candidate order (prose left out)."""
    out: dict[str, list[int]] = {}
    for candidate in sorted(keys):
        key = keys[candidate]
        if key is not None:
            out.setdefault(key, []).append(candidate)
    return out


def votes_of(counts: Mapping[str, Sequence[int]]) -> dict[str, int]:
    return {display(key): len(members) for key, members in counts.items()}


def early(keys: Mapping[int, str | None], n_total: int) -> Verdict | None:
    """An absolute majority of n_total among the finished candidates' keys, or None."""
    counts = tally(keys)
    for key, members in counts.items():
        if len(members) >= majority(n_total):
            return Verdict(members[0], "majority", len(members), votes_of(counts))
    return None


def _standing(counts: Mapping[str, Sequence[int]], key: str) -> tuple[int, int]:
    """How the plurality ranks an answer: more votes first, then the lower first candidate."""
    return len(counts[key]), -counts[key][0]


def settled(keys: Mapping[int, str | None], pending: Sequence[int]) -> Verdict | None:
    """The plurality's verdict when no answers the `pending` candidates could give change its
    winner (see the module docstring), or None."""
    counts = tally(keys)
    if not pending or not counts:
        return None
    leader = max(counts, key=lambda key: _standing(counts, key))
    votes, first = len(counts[leader]), counts[leader][0]
    spare, lowest = len(pending), min(pending)
    if votes < 2 or lowest < first:
        return None
    rivals = [(len(members) + spare, -min(members[0], lowest)) for key, members in counts.items() if key != leader]
    rivals.append((spare, -lowest))  # an answer none of the finished gave, given by every pending one
    if any(rival >= _standing(counts, leader) for rival in rivals):
        return None
    return Verdict(first, "plurality", votes, votes_of(counts))


def decide(texts: Mapping[int, str], n_total: int, *, json_only: bool = False) -> Verdict:
    """The verdict once no more candidates will finish (texts: candidate -> its answer)."""
    if not texts:
        raise ValueError("no candidate finished")
    keys = {candidate: answer_key(text, json_only=json_only) for candidate, text in texts.items()}
    found = early(keys, n_total)
    if found is not None:
        return found
    if json_only and any(key is not None for key in keys.values()):  # a cut answer never beats a whole one
        texts = {candidate: text for candidate, text in texts.items() if keys[candidate] is not None}
    counts = tally(keys)
    votes = votes_of(counts)
    if len(texts) == 1:
        (only,) = texts
        return Verdict(only, "single", 1, votes)
    best = max(counts, key=lambda key: _standing(counts, key), default=None)
    if best is not None and len(counts[best]) >= 2:
        return Verdict(counts[best][0], "plurality", len(counts[best]), votes)
    order = sorted(texts)
    return Verdict(order[medoid([texts[c] for c in order])], "medoid", 1, votes)
