"""Shared rows: sequences of one group with the same tokens so far decode one row of logits.

The candidates of a Conclave (and the n > 1 siblings of a request) are forks of one prompt.
While two of them have drawn the same tokens, their next-token distributions are the same
distribution: same context, same model. So the step decodes only one of them (the leader,
carrying its draft as usual) and every other identical sequence (a rider) draws its own
tokens from the leader's rows with its own sampler (its own seed, temperature, penalties,
grammar): row j is the distribution after entry token j for the rider too, as long as the
rider agrees with the entry up to j. The walk is the one verify.py makes for a draft: the
rider keeps the leader's entry tokens while its own choices equal them, and at the first
choice that differs (or past the last row) that choice is its next token; from then on it is
a sequence of its own. Its KV for the tokens it kept is the leader's cells, shared
(`llama_memory_seq_cp` in a unified KV adds the rider's id to the cells; no copy).

Exact: every token a rider draws is drawn from the row plain decoding would compute for it
(up to the kernels' batch near-ties), with the random number of its own position, so a seeded
rider draws what it would have drawn decoding alone.

A step of 5 identical candidates costs one sequence's rows instead of five; the Conclave's
candidates agree for long runs wherever the model is sure (copying, extraction), which is
where they cost most without this.
"""

from __future__ import annotations

from typing import Protocol, Sequence as Seq, TypeVar


class _Rideable(Protocol):
    group: int
    n_past: int
    tokens: list[int]
    pending: list[int]


S = TypeVar("S", bound=_Rideable)


def riders(decoding: Seq[S]) -> tuple[list[S], dict[int, list[S]]]:
    """Split the step's decoding sequences into leaders (in order) and, by leader id(), the
    sequences of its group whose KV length, tokens and pending tokens are the same as its own."""
    leaders: list[S] = []
    riding: dict[int, list[S]] = {}
    first: dict[tuple[int, int, int, tuple[int, ...]], list[S]] = {}
    for seq in decoding:
        key = (seq.group, seq.n_past, len(seq.tokens), tuple(seq.pending))
        same = next((lead for lead in first.get(key, ()) if lead.tokens == seq.tokens), None)
        if same is None:
            first.setdefault(key, []).append(seq)
            leaders.append(seq)
        else:
            riding.setdefault(id(same), []).append(seq)
    return leaders, riding
