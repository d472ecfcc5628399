"""The fewest steps a drafter that drafts from text seen can take over an answer already known.

A sequence's step gives it one token beyond the draft tokens it keeps. A source that drafts
from text (prompt lookup, the Palimpsest, Il Suggeritore) proposes what followed an earlier
occurrence of the context's last tokens: in the prompt, in the text the node learned before,
or in the answer so far (a loop included: an occurrence running into the context's end goes
on around it). The oracle here knows the answer the sequence goes on to write, and at each
step takes, of every earlier occurrence of the context's last `min_match` tokens or more, the
one whose continuation agrees with the answer longest (at most `max_draft` tokens): no source
that drafts from that text keeps more a step, and none verifies fewer rows (the oracle drafts
exactly what is kept). A draft model, which writes text no source holds, is not bounded by it.
bench/speculation.py's `text_ceiling` puts those steps on the cost line.

With `min_match` 1 the oracle may pick, among every earlier occurrence of a single token, the
one the answer goes on from: a loose bound. With SOURCES_MIN_MATCH it bounds the node's own
sources, none of which drafts from an occurrence matching fewer context tokens (prompt lookup's
shortest n-gram, the Palimpsest's index key).
"""

from __future__ import annotations

import collections
from typing import Sequence

from node.speculative.lookup import MIN_N as LOOKUP_MIN_N
from node.speculative.palimpsest import KEY_N as PALIMPSEST_KEY_N

SOURCES_MIN_MATCH = min(LOOKUP_MIN_N, PALIMPSEST_KEY_N)


def oracle_steps(prompt: Sequence[int], generated: Sequence[int], learned: Sequence[Sequence[int]],
                 max_draft: int = 16, min_match: int = 1) -> int:
    """Steps after the first token (which the prompt's own step gives) to write `generated`."""
    own = [*prompt, *generated]
    base, length = len(prompt), len(generated)
    streams = [tuple(s) for s in learned]
    where: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)  # token -> (stream, position)
    for s, stream in enumerate(streams):
        for p, token in enumerate(stream):
            where[token].append((s, p))
    for p in range(base):
        where[own[p]].append((-1, p))
    steps, t = 0, 1
    indexed = base  # positions of `own` entered in `where` so far
    while t < length:
        end = base + t  # the context is own[:end]; the step writes generated[t] and what the draft keeps
        for p in range(indexed, end - 1):  # the answer so far, bar the context's last token itself
            where[own[p]].append((-1, p))
        indexed = end - 1
        best = 0
        for s, p in where.get(own[end - 1], ()):
            text = own if s < 0 else streams[s]
            k = 1
            while k < min_match and p - k >= 0 and text[p - k] == own[end - 1 - k]:
                k += 1
            if k < min_match:
                continue
            c = 0
            while c < max_draft and p + 1 + c < len(text) and t + c < length and text[p + 1 + c] == generated[t + c]:
                c += 1
            best = max(best, c)
        t += best + 1
        steps += 1
    return steps

