"""KVBudget's resident prefixes as a table: which free slot a prompt takes, how much of it
the slot's KV keeps, and which residents go when the reservations need their cells."""

from __future__ import annotations

import pytest

from node.engine.budget import RESIDENT_MIN_MATCH, KVBudget, common_prefix

DOC = tuple(range(100, 100 + 3 * RESIDENT_MIN_MATCH))
ALWAYS = lambda slot, n: True  # noqa: E731  (no sliding window)


@pytest.mark.parametrize("a, b, n", [((), (1,), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2), 2),
                                     ((1, 2, 3), (1, 9, 3), 1), ((5,), (6,), 0)])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n


def budget_with(residents: dict[int, tuple[int, ...]], n_slots: int = 3, n_cells: int = 1000) -> KVBudget:
    budget = KVBudget(n_slots, n_cells)
    for slot, tokens in residents.items():  # kept in this order: the first left longest ago
        budget.keep(slot, tokens)
    return budget


@pytest.mark.parametrize("residents, prompt, expected", [
    ({}, DOC + (1,), (2, 0)),                                           # nothing resident: an empty slot
    ({0: DOC + (7, 8)}, DOC + (1, 2), (0, len(DOC))),                   # the exact token it differs at
    ({0: DOC[:40], 1: DOC + (5,)}, DOC + (1,), (1, len(DOC))),          # the longest prefix wins
    ({0: DOC + (1,)}, DOC + (1,), (0, len(DOC))),                       # the same prompt: all but its last token
    ({0: DOC[:RESIDENT_MIN_MATCH - 1]}, DOC + (1,), (2, 0)),            # too short to be worth a resident slot
    ({0: (1, 2), 1: (3, 4), 2: (5, 6)}, DOC, (0, 0)),                   # all resident, none shares: the oldest
    ({0: DOC}, None, (2, 0)),                                           # a fork or follower: an empty slot
    ({0: DOC, 1: (3, 4), 2: (5, 6)}, None, (0, 0)),                     # ... else the oldest
])
def test_choose(residents, prompt, expected):
    budget = budget_with(residents)
    assert budget.choose(prompt, ALWAYS) == expected


def test_a_slot_whose_window_is_gone_is_not_continued():
    budget = budget_with({0: DOC + (1,)})
    assert budget.choose(DOC + (2,), lambda slot, n: False) == (2, 0)


def test_taking_a_slot_forgets_its_resident_and_overflow_frees_the_oldest_first():
    budget = budget_with({0: DOC, 1: DOC[:50], 2: DOC[:60]}, n_cells=len(DOC) + 120)
    assert budget.resident_cells == len(DOC) + 110 and budget.overflow() == []

    class Seq:  # the fields KVBudget reads and writes of a Sequence
        prompt, spare, slot, own_cells, share = DOC[:10], 0, -1, 0, None

    seq = Seq()
    budget.take(seq, 100, None, slot=1)  # 10 prompt + 100 own cells reserved
    assert seq.slot == 1 and 1 not in budget.resident and budget.free_slots == [0, 2]
    assert budget.overflow() == [0]  # 110 reserved + 96 + 60 resident > 216 cells: the oldest goes
    assert budget.resident_cells == 60 and budget.overflow() == []
    budget.release(seq)
    assert budget.reserved == 0 and sorted(budget.free_slots) == [0, 1, 2]
    assert budget.drop_residents() == [2] and budget.resident_cells == 0


def test_only_the_tenant_that_left_a_slot_continues_from_it():
    """Another key's request sharing the prefix takes an empty slot: reusing the slot would
    tell it (by cached_tokens and time to first token) that the prefix was asked before."""
    budget = KVBudget(3, 1000)
    budget.keep(0, DOC + (7,), scope="tenant-a")
    assert budget.choose(DOC + (1,), ALWAYS, "tenant-b") == (2, 0)
    assert budget.choose(DOC + (1,), ALWAYS) == (2, 0)  # the keyless tenant is a scope of its own
    assert budget.choose(DOC + (1,), ALWAYS, "tenant-a") == (0, len(DOC))
