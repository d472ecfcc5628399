"""Who may hold KV cells: the slots (llama seq ids), the reservation of cells, resident prefixes.

Admission reserves what a request can grow to: its prompt + max_tokens + draft room. A
prompt shared by forks (identical prompts, `submit_n`) is reserved once, in a
`PromptShare` the last of its users releases, together with the cells it holds for forks
not started yet (a Conclave reserves for all its candidates when the first ones start). The sum of reservations never exceeds the
context's cells, so an admitted request can never run out of KV mid-generation and no
decode fails for lack of room; what does not fit waits in the queue.

Resident prefixes: a slot whose request ended keeps its KV (`keep`), and the tokens it
holds are remembered. A new prompt takes the free slot holding the longest prefix of it
(`choose`) and continues at the first token that differs; with no such slot it takes an
empty one, else the one left longest ago, whose KV goes. Resident cells are not reserved:
whenever the reservations need them, residents go, least recently left first (`overflow`),
so the sum of reservations and resident cells never exceeds the context's cells either.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import numpy as np

from node.engine.sequence import Phase, PromptShare, Sequence

RESIDENT_MIN_MATCH = 32  # shorter shared prefixes (a chat template's header) take an empty slot instead


@dataclass(slots=True)
class Resident:
    """What the KV of a free slot still holds: tokens at positions 0..len-1."""

    tokens: tuple[int, ...]
    left: int  # a tick of the budget's clock: when its request ended
    scope: str = ""  # the tenant whose request left it (GenerationRequest.cache_scope): only its own reuse it


def common_prefix(a: Seq[int], b: Seq[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n


class KVBudget:
    def __init__(self, n_slots: int, n_cells: int) -> None:
        self.n_slots = n_slots
        self.n_cells = n_cells
        self.free_slots = list(range(n_slots))
        self.reserved = 0
        self.resident: dict[int, Resident] = {}  # free slot -> what its KV holds
        self.resident_cells = 0
        self._clock = itertools.count()

    def fits(self, prompt_cells: int, own_cells: int) -> bool:
        """Whether a slot is free and the cells can be reserved on top of every reservation."""
        return bool(self.free_slots) and self.reserved + prompt_cells + own_cells <= self.n_cells

    def take(self, seq: Sequence, own_cells: int, share: PromptShare | None, slot: int | None = None) -> None:
        """Give seq a slot (`slot`, one of the free ones, else any) and its reservation; share
        None: a new prompt of its own. The slot's resident record goes (the caller trims its KV)."""
        if slot is None:
            slot = self.free_slots[-1]
        self.free_slots.remove(slot)
        self._forget(slot)
        seq.slot = slot
        seq.own_cells = own_cells
        if share is None:
            share = PromptShare(len(seq.prompt))
            self.reserved += share.cells
        else:
            share.users += 1
        seq.share = share
        self.reserved += own_cells
        if seq.spare:
            share.spare += seq.spare
            self.reserved += seq.spare

    def take_fork(self, seq: Sequence, own_cells: int, share: PromptShare, slot: int | None = None) -> None:
        """A fork of a prompt already in the KV: its cells come from the share's spare ones
        as far as they go, the rest from the free cells (the caller checked they fit)."""
        drawn = min(share.spare, own_cells)
        share.spare -= drawn
        self.reserved -= drawn
        seq.spare = 0
        self.take(seq, own_cells, share, slot)

    def release(self, seq: Sequence) -> int | None:
        """Return seq's reservation; gives back the slot it held (the caller clears its KV)."""
        slot, seq.slot = seq.slot, -1
        if slot >= 0:
            self.free_slots.append(slot)
        self.reserved -= seq.own_cells
        if seq.share is not None:
            seq.share.users -= 1
            if seq.share.users == 0:
                self.reserved -= seq.share.cells + seq.share.spare
                seq.share.spare = 0
        seq.own_cells, seq.share = 0, None
        return slot if slot >= 0 else None

    # -- resident prefixes ----------------------------------------------------------------------

    def choose(self, prompt: Seq[int] | None, usable: Callable[[int, int], bool],
               scope: str = "") -> tuple[int, int]:
        """The free slot a new sequence takes and how many leading tokens of `prompt` its KV
        holds already (at most all but the last: the last is decoded for the first logits).
        `usable(slot, n)`: whether the slot's KV cut at n tokens is complete (a sliding
        window may have dropped what the token at n attends to). prompt None: a sequence
        whose KV comes from elsewhere (a follower, a fork) takes an empty slot if any. Only a
        slot left by the same `scope` (tenant) continues: another tenant's prefix is never
        reused, so its time to first token and `cached_tokens` say nothing of it."""
        held: dict[int, int] = {}  # free slot -> tokens of the prompt its KV can continue from
        if prompt:
            for slot in self.free_slots:
                resident = self.resident.get(slot)
                if resident is not None and resident.scope == scope:
                    n = min(common_prefix(resident.tokens, prompt), len(prompt) - 1)
                    held[slot] = n if n > 0 and usable(slot, n) else 0
        best = max(held, key=lambda slot: held[slot], default=-1)
        if best >= 0 and held[best] >= RESIDENT_MIN_MATCH:
            return best, held[best]
        empty = [slot for slot in self.free_slots if slot not in self.resident]
        if empty:
            return empty[-1], 0
        return min(self.free_slots, key=lambda slot: self.resident[slot].left), 0

    def keep(self, slot: int, tokens: Seq[int], scope: str = "") -> None:
        """A free slot's KV holds these tokens: a later prompt of the same scope sharing their
        prefix may take it."""
        self._forget(slot)
        if tokens:
            self.resident[slot] = Resident(tuple(tokens), next(self._clock), scope)
            self.resident_cells += len(tokens)

    def overflow(self) -> list[int]:
        """Slots whose resident KV must go (least recently left first) for the reservations to
        have their cells; their records are gone, the caller clears their KV."""
        gone = []
        while self.resident and self.reserved + self.resident_cells > self.n_cells:
            slot = min(self.resident, key=lambda s: self.resident[s].left)
            self._forget(slot)
            gone.append(slot)
        return gone

    def drop_residents(self) -> list[int]:
        """Forget every resident prefix; the slots whose KV the caller clears."""
        gone = list(self.resident)
        for slot in gone:
            self._forget(slot)
        return gone

    def _forget(self, slot: int) -> None:
        resident = self.resident.pop(slot, None)
        if resident is not None:
            self.resident_cells -= len(resident.tokens)

    @staticmethod
    def cells_used(active: list[Sequence]) -> int:
        """KV cells held by the active sequences, a prompt shared by forks counted once."""
        used, seen = 0, set()
        for seq in active:
            if seq.phase is Phase.FOLLOWER:
                continue
            shared = seq.share is not None and id(seq.share) in seen
            used += seq.n_past - (len(seq.prompt) if shared else 0)
            if seq.share is not None:
                seen.add(id(seq.share))
        return used
