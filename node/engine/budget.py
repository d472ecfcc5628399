"""Who may hold KV cells: the slots (llama seq ids) and the reservation of cells.

Admission reserves what a request can grow to: its prompt + max_tokens + draft room. A
prompt shared by forks (identical prompts, `submit_n`) is reserved once, in a
`PromptShare` the last of its users releases, together with the cells it holds for forks
not started yet (a Conclave reserves for all its candidates when the first ones start). The sum of reservations never exceeds the
context's cells, so an admitted request can never run out of KV mid-generation and no
decode fails for lack of room; what does not fit waits in the queue.
"""

from __future__ import annotations

from node.engine.sequence import Phase, PromptShare, Sequence


class KVBudget:
    def __init__(self, n_slots: int, n_cells: int) -> None:
        self.n_slots = n_slots
        self.n_cells = n_cells
        self.free_slots = list(range(n_slots))
        self.reserved = 0

    def fits(self, prompt_cells: int, own_cells: int) -> bool:
        """Whether a slot is free and the cells can be reserved on top of every reservation."""
        return bool(self.free_slots) and self.reserved + prompt_cells + own_cells <= self.n_cells

    def take(self, seq: Sequence, own_cells: int, share: PromptShare | None) -> None:
        """Give seq a slot and its reservation; share None: a new prompt of its own."""
        seq.slot = self.free_slots.pop()
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

    def take_fork(self, seq: Sequence, own_cells: int, share: PromptShare) -> None:
        """A fork of a prompt already in the KV: its cells come from the share's spare ones
        as far as they go, the rest from the free cells (the caller checked they fit)."""
        drawn = min(share.spare, own_cells)
        share.spare -= drawn
        self.reserved -= drawn
        seq.spare = 0
        self.take(seq, own_cells, share)

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
