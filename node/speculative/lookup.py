"""Prompt lookup: draft what followed the longest suffix of the context seen earlier in it.

Per request (the group of sibling sequences of one request share it), an index maps every
n-gram (MIN_N..MAX_N tokens) to where it last ended: the stream it is in and the position
of the token after it. Each new token adds MAX_N - MIN_N + 1 entries, so keeping the index
current costs O(1) per token and a proposal is at most MAX_N dictionary probes, then at
most MAX_RUN comparisons measuring how far back the context agrees with the occurrence
found (the draft's `match`): never a scan of the context. A match whose n-gram occurs only
in the sequence's own output, not in its prompt, is an echo (`Draft.echo`): a text repeating
itself, which goes on as the earlier occurrence did far less often than a quote of the prompt
does, so the controller learns the two apart. (The newest occurrence of a quoted n-gram is
often the output's own copy of it; a copy under way is still a quote.) The newest occurrence
wins, so a sibling that is ahead on the same text (n > 1) drafts for the ones behind it.

The context's own last n-grams are entered only after they are looked up (a suffix always
matches itself), so a match is always an earlier occurrence. Where that occurrence is so
recent that what followed it runs into the context's end (a run of one digit, a phrase of a few
tokens said again and again), the text since it is a loop, and the draft goes on around it: the
newest occurrence of a run's n-gram ends one token back, and would draft one token a step.

A group whose members have all ended is kept (the last RETAINED_GROUPS of them): a member
joining it later (a Conclave's candidate started once the first ones disagreed, usually
after they all finished) drafts from their finished texts, which it agrees with most of the
time. (The Palimpsest learns them too, when the archive source is on, as a few of the
node's many streams; this index is the request's own.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from node.engine.hooks import Draft, DraftSeq
from node.speculative.groups import GroupStates
from node.speculative.source import agreeing_run

MIN_N = 2
MAX_N = 6
MAX_RUN = 32  # the longest run measured behind a matched n-gram
RETAINED_GROUPS = 4  # ended groups kept for members that may still join them


@dataclass(slots=True)
class _Group:
    index: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)  # n-gram -> (key, next pos)
    streams: dict[int, Sequence[int]] = field(default_factory=dict)  # sequence key -> its context
    indexed: dict[int, int] = field(default_factory=dict)            # sequence key -> tokens entered
    quoted: set[tuple[int, ...]] = field(default_factory=set)        # the n-grams of the members' prompts


class PromptLookup:
    """The `lookup` draft source."""

    name = "lookup"
    cost_per_token = 0.0

    def __init__(self, min_n: int = MIN_N, max_n: int = MAX_N) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._table: GroupStates[_Group] = GroupStates(lambda seq: _Group(), RETAINED_GROUPS)
        self._groups = self._table.live
        self._ended = self._table.ended

    def begin(self, seq: DraftSeq) -> None:
        self._table.begin(seq).indexed[seq.key] = 0

    def _enter(self, group: _Group, key: int, context: Sequence[int], upto: int, prompt: int) -> None:
        """Enter the n-grams ending before position `upto` that are not entered yet (those of
        the first `prompt` tokens also as quoted)."""
        index, lo, hi = group.index, self.min_n, self.max_n
        for end in range(group.indexed[key], upto):
            for n in range(lo, min(hi, end + 1) + 1):
                gram = tuple(context[end + 1 - n:end + 1])
                index[gram] = (key, end + 1)
                if end < prompt:
                    group.quoted.add(gram)
        group.indexed[key] = max(group.indexed[key], upto)

    def propose(self, seq: DraftSeq, context: Sequence[int], k: int) -> Draft | None:
        group = self._groups.get(seq.group)
        if group is None or seq.key not in group.indexed:
            return None
        group.streams[seq.key] = context
        length = len(context)
        self._enter(group, seq.key, context, length - 1, len(seq.prompt))
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            gram = tuple(context[length - n:])
            hit = group.index.get(gram)
            if hit is None:
                continue
            stream = group.streams.get(hit[0])
            if stream is None:
                continue
            if hit[0] == seq.key and hit[1] < length < hit[1] + k:  # it runs into the context's end: a loop
                tokens = _looped(context, hit[1], k)
            else:
                tokens = tuple(stream[hit[1]:hit[1] + k])
            if tokens:
                return Draft(tokens, self.name, match=agreeing_run(stream, hit[1], context, n, MAX_RUN),
                             echo=hit[0] == seq.key and gram not in group.quoted)
        return None

    def peek(self, seq: DraftSeq, tail: Sequence[int], k: int) -> tuple[int, ...]:
        """What followed the longest indexed suffix of `tail` (read only: nothing is entered),
        for a source that drafts beyond its own tokens (Il Suggeritore after forced tokens)."""
        group = self._groups.get(seq.group)
        if group is None or k <= 0:
            return ()
        for n in range(min(self.max_n, len(tail)), self.min_n - 1, -1):
            hit = group.index.get(tuple(tail[len(tail) - n:]))
            if hit is None:
                continue
            stream = group.streams.get(hit[0])
            if stream is not None and hit[1] < len(stream):
                return tuple(stream[hit[1]:hit[1] + k])
        return ()

    def end(self, seq: DraftSeq, tokens: Sequence[int]) -> None:
        group = self._groups.get(seq.group)
        if group is not None and seq.key in group.streams:
            group.streams[seq.key] = tuple(tokens)  # its whole text, for members joining later
        self._table.end(seq)


def _looped(context: Sequence[int], start: int, k: int) -> tuple[int, ...]:
    """k tokens on from `start`, where the context goes on as it went from `start`: the text
    since then is a loop of that period (a run of zeros, a repeated short phrase), and goes on
    past the context's end as it did."""
    period = len(context) - start
    return tuple(context[start + i % period] for i in range(k))
