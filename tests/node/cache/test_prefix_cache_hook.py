"""The engine hook over RAM and disk: longest-prefix lookup, the store policy, restarts and
model swaps. States here are synthetic byte strings: what is checked is which state comes
back for which prompt (the real model's restore lives in test_prefix_cache_engine.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node.cache.keys import CacheIdentity
from node.cache.prefix_cache import LOCAL_WRITER_NICE, PrefixCache, PrefixCacheConfig

IDENTITY = CacheIdentity(model_fingerprint="ab" * 32, runtime="test")
DOC = list(range(1000, 1040))  # 40 tokens = 5 blocks of 8


def make(tmp_path=None, identity=IDENTITY, **overrides) -> PrefixCache:
    fields = dict(directory=tmp_path, block_tokens=8, checkpoint_tokens=0, min_gain_tokens=0,
                  ram_bytes=10**6, disk_bytes=10**6)
    fields.update(overrides)
    return PrefixCache(identity, PrefixCacheConfig(**fields))


def fake_state(tokens, n):
    return ("|".join(map(str, tokens[:n]))).encode()


def run_prompt(cache: PrefixCache, prompt) -> tuple[int, list[int]]:
    """What the engine does: look up, then store every boundary it is asked for."""
    hit = cache.lookup(prompt)
    restored = 0
    if hit is not None:
        restored, state = hit
        assert state == fake_state(prompt, restored)
    stored = [n for n in cache.boundaries_to_store(prompt) if n > restored]
    for n in stored:
        cache.store(prompt, n, fake_state(prompt, n))
    return restored, stored


@pytest.fixture
def cache(tmp_path):
    c = make(tmp_path)
    yield c
    c.close()


def test_first_prompt_stores_only_its_tail_and_second_stores_the_fork_point(cache):
    q1 = DOC + [1, 2, 3]
    assert run_prompt(cache, q1) == (0, [40])
    q2 = DOC + [4, 5, 6, 7, 8, 9, 10, 11, 12]  # tail boundary 48 is question-specific
    assert run_prompt(cache, q2) == (40, [48])
    q3 = DOC[:36] + [7] * 20  # diverges inside block 5: shares 4 blocks with the others
    restored, stored = run_prompt(cache, q3)
    assert restored == 0 and stored == [32, 48]  # fork point 32, and its own tail
    assert run_prompt(cache, DOC[:36] + [9] * 5) == (32, [40])  # restores the fork point
    assert cache.stats()["lookups"] == 4


def test_checkpoints_every_n_tokens(tmp_path):
    cache = make(tmp_path, checkpoint_tokens=16)
    try:
        assert run_prompt(cache, DOC + [1]) == (0, [16, 32, 40])
    finally:
        cache.close()


def test_snapshots_must_save_enough_prefill(tmp_path):
    cache = make(tmp_path, checkpoint_tokens=16, min_gain_tokens=16)
    try:
        assert run_prompt(cache, DOC + [1]) == (0, [16, 32])  # 40 is only 8 past 32
        assert run_prompt(cache, DOC + list(range(30))) == (32, [48, 64])  # 40 gains only 8
        assert run_prompt(cache, DOC + [2]) == (32, [])  # the fork at 40 gains too little
    finally:
        cache.close()


def test_never_asks_twice_for_a_stored_boundary(cache):
    prompt = DOC + [1]
    run_prompt(cache, prompt)
    assert cache.boundaries_to_store(prompt) == []
    cache.flush()
    cache.ram.discard(cache.chain.boundaries(prompt)[-1].key)
    assert cache.boundaries_to_store(prompt) == []  # still on disk


def test_a_prompt_that_is_exactly_a_boundary_keeps_one_token_to_decode(cache):
    prompt = DOC[:16]
    assert run_prompt(cache, prompt) == (0, [8])
    assert cache.lookup(prompt)[0] == 8


def test_store_ignores_states_off_a_boundary(cache):
    cache.store(DOC, 7, b"x")
    assert cache.lookup(DOC) is None


def test_hits_survive_a_restart_through_the_disk(tmp_path):
    first = make(tmp_path)
    run_prompt(first, DOC + [1])
    first.close()
    second = make(tmp_path)
    try:
        assert run_prompt(second, DOC + [2]) == (40, [])
        stats = second.stats()
        assert stats["disk_hits"] == 1 and stats["ram_misses"] == 1 and stats["tokens_restored"] == 40
        assert run_prompt(second, DOC + [3])[0] == 40
        assert second.stats()["ram_hits"] == 1  # promoted into RAM by the disk hit
    finally:
        second.close()


def test_preload_moves_a_disk_prefix_into_ram_before_the_lookup(tmp_path):
    first = make(tmp_path, checkpoint_tokens=16)
    run_prompt(first, DOC + [1])  # 16, 32 and 40
    first.close()
    second = make(tmp_path)
    try:
        second.ram.put(second.chain.boundaries(DOC)[1].key, second.disk.get(second.chain.boundaries(DOC)[1].key))
        assert second.preload(DOC + [2]) == 40  # longer than what RAM holds
        assert second.preload(DOC + [2]) == 0  # now RAM has the best
        assert second.lookup(DOC + [2]) == (40, fake_state(DOC, 40))
        stats = second.stats()
        assert stats["ram_hits"] == 1 and stats["disk_hits"] == 0 and stats["disk_preloads"] == 1
    finally:
        second.close()


def test_a_different_model_never_restores(tmp_path):
    first = make(tmp_path)
    run_prompt(first, DOC + [1])
    first.close()
    swapped = make(tmp_path, CacheIdentity(model_fingerprint="cd" * 32, runtime="test"))
    try:
        assert swapped.lookup(DOC + [1]) is None
        assert swapped.stats()["disk_misses"] == 1
    finally:
        swapped.close()


def test_a_damaged_file_is_a_miss_then_falls_back_to_a_shorter_prefix(tmp_path):
    first = make(tmp_path, checkpoint_tokens=16)
    run_prompt(first, DOC + [1])  # stores 16, 32, 40
    first.close()
    path = first.disk.path_for(first.chain.boundaries(DOC)[-1].key)
    path.write_bytes(path.read_bytes()[:-3])
    second = make(tmp_path)
    try:
        assert second.lookup(DOC + [1])[0] == 32
        assert not path.exists()
        assert second.stats()["disk_corrupt_deleted"] == 1
    finally:
        second.close()


def test_ram_only_cache_and_tiny_ram_budget(tmp_path):
    ram_only = make(None)
    try:
        run_prompt(ram_only, DOC + [1])
        assert ram_only.lookup(DOC + [2])[0] == 40
    finally:
        ram_only.close()
    disk_mostly = make(tmp_path, ram_bytes=0)
    try:
        run_prompt(disk_mostly, DOC + [1])
        disk_mostly.flush()
        assert disk_mostly.lookup(DOC + [2])[0] == 40
        assert disk_mostly.stats()["disk_hits"] == 1
    finally:
        disk_mostly.close()


def test_compressed_entries_round_trip(tmp_path):
    cache = make(tmp_path, compress=True)
    run_prompt(cache, DOC + [1])
    cache.close()
    again = make(tmp_path, compress=True)
    try:
        assert again.lookup(DOC + [1]) == (40, fake_state(DOC, 40))
    finally:
        again.close()


def test_full_write_queue_drops_to_ram_only(tmp_path):
    cache = make(tmp_path, write_queue=1)
    try:
        for i in range(50):
            cache.store([i] * 8 + [0], 8, b"s" * 100)
        cache.flush()
        stats = cache.stats()
        assert stats["stores"] == 50
        assert stats["disk_entries"] + stats["stores_dropped"] == 50
    finally:
        cache.close()


def test_a_tenants_states_are_found_only_under_its_scope(cache):
    """Each tenant's chain has a root of its own: a prefix stored for one is a miss for another,
    and the open tenant ("") keeps the keys a node without tenants always had."""
    prompt = DOC + [1]
    assert cache.boundaries_to_store(prompt, "tenant-a") == [40]
    cache.store(prompt, 40, fake_state(prompt, 40), "tenant-a")
    assert cache.lookup(prompt, "tenant-a") == (40, fake_state(prompt, 40))
    assert cache.lookup(prompt, "tenant-b") is None and cache.lookup(prompt) is None
    assert cache.boundaries_to_store(prompt, "tenant-b") == [40]  # B prefills and stores its own
    assert cache.chain.restorable(prompt) == cache.chain.boundaries(prompt, limit=40)
    open_keys = {b.key for b in cache.chain.boundaries(prompt)}
    assert open_keys.isdisjoint(b.key for b in cache.chain.boundaries(prompt, scope="tenant-a"))
    assert cache.chain.root_of("") == cache.chain.root == IDENTITY.root()


# -- exact fork points (node/cache/forks.py) ---------------------------------------------------

def test_a_prompt_departing_inside_a_block_is_restored_to_the_token_by_later_ones(tmp_path):
    cache = make(tmp_path, exact_min_gain_tokens=2)
    try:
        first = DOC + [1, 2, 3, 4, 5, 6]
        assert run_prompt(cache, first) == (0, [40])
        second = DOC + [1, 2, 3, 9, 9, 9, 9, 9]  # agrees with the first 3 tokens past boundary 40
        assert run_prompt(cache, second) == (40, [43])
        assert cache.stats()["exact_stores"] == 1
        third = DOC + [1, 2, 3, 7, 7]
        assert run_prompt(cache, third) == (43, [])  # the fork state, to the token
        assert run_prompt(cache, DOC + [1, 8, 8, 8]) == (40, [])  # not its tokens past 40: the block
        stats = cache.stats()
        assert stats["exact_hits"] == 1 and stats["tokens_restored"] == 40 + 43 + 40
    finally:
        cache.close()


def test_a_prompt_never_forks_from_itself(cache):
    prompt = DOC + [1, 2, 3, 4, 5, 6]
    for _ in range(3):  # the engine asks again while a request waits for another's prefill
        assert all(n % 8 == 0 for n in cache.boundaries_to_store(prompt))


def test_exact_fork_states_must_save_enough_and_stay_in_ram(tmp_path):
    cache = make(tmp_path, exact_min_gain_tokens=4)
    try:
        run_prompt(cache, DOC + [1, 2, 3, 4, 5, 6])
        assert run_prompt(cache, DOC + [1, 2, 3, 9, 9]) == (40, [])  # 3 tokens past the block: too few
        assert run_prompt(cache, DOC + [1, 2, 3, 4, 5, 9]) == (40, [45])
        assert cache.flush()
    finally:
        cache.close()
    restarted = make(tmp_path, exact_min_gain_tokens=4)
    try:  # the disk holds the block states only: the fork index was this process's
        assert restarted.lookup(DOC + [1, 2, 3, 4, 5, 7, 7])[0] == 40
    finally:
        restarted.close()


def test_exact_fork_states_are_per_tenant():
    cache = make(None, exact_min_gain_tokens=2)
    try:
        first, second = DOC + [1, 2, 3, 4, 5, 6], DOC + [1, 2, 3, 9, 9, 9]
        for prompt in (first, second):
            hit = cache.lookup(prompt, "acme")
            restored = hit[0] if hit else 0
            for n in cache.boundaries_to_store(prompt, "acme"):
                if n > restored:
                    cache.store(prompt, n, fake_state(prompt, n), "acme")
        assert cache.lookup(DOC + [1, 2, 3, 7, 7], "acme")[0] == 43
        assert cache.lookup(DOC + [1, 2, 3, 7, 7]) is None  # the open tenant finds none of it
    finally:
        cache.close()


def test_a_state_is_cut_where_a_prompt_parts_from_it_if_its_window_allows():
    first = DOC + list(range(1, 12))  # 51 tokens: its state is stored at 48
    second = DOC + [1, 2, 3, 4, 5, 99, 99, 99, 99]  # shares 45 tokens with it, past boundary 40
    for window, restored in ((None, None), (44, None), (0, 45), (64, 45)):
        cache = make(None)
        try:
            if window is not None:
                cache.bind_window(window)  # the engine's model: no sliding window (0), or one of `window` tokens
            assert run_prompt(cache, first) == (0, [48])
            hit = cache.lookup(second)
            assert (hit[0] if hit else None) == restored, window
            if hit is not None:  # the whole state of the first prompt: the engine cuts it at 45
                assert hit[1] == fake_state(first, 48) and cache.stats()["exact_hits"] == 1
        finally:
            cache.close()


def test_the_fork_index_is_bounded():
    from node.cache.forks import STATES_PER_BOUNDARY, ForkIndex

    index = ForkIndex(block_tokens=8, capacity=40)
    for boundary in range(10):
        for tail in range(STATES_PER_BOUNDARY + 3):  # more than a boundary keeps
            index.add(bytes([boundary]) * 32, bytes([tail]) * 4, bytes([boundary, tail]) * 16)
    assert len(index) <= 40
    assert len(index) >= 40 - STATES_PER_BOUNDARY  # whole boundaries go, least recent first


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread niceness is read from Linux's /proc")
def test_adopted_states_are_written_below_the_engine_and_computed_ones_are_not(cache):
    """A state adopted from the fleet goes to disk on CPU the engine's threads leave; a state this
    node computed is offered to the fleet at the process's priority (a busy host would hold it back)."""
    def nice(thread) -> int:
        stat = Path(f"/proc/self/task/{thread.native_id}/stat")
        return int(stat.read_text().rsplit(")", 1)[1].split()[16])  # field 19, counted after the name's ")"

    deadline = time.monotonic() + 5  # the thread lowers its own priority as it starts
    while nice(cache._local_writer) != LOCAL_WRITER_NICE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nice(cache._local_writer) == LOCAL_WRITER_NICE
    assert nice(cache._writer) == os.getpriority(os.PRIO_PROCESS, 0) < LOCAL_WRITER_NICE
