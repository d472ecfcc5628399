"""RAM and disk tiers: LRU budgets, damaged files, restarts and two processes sharing a directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from node.cache import blob
from node.cache.blob import StateBlob
from node.cache.disk import DiskTier
from node.cache.ram import RamTier

ROOT = Path(__file__).resolve().parents[3]


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def state(i: int, size: int = 1000) -> bytes:
    return bytes([i % 256]) * size


def put(disk: DiskTier, i: int, size: int = 1000) -> int:
    return disk.put(key(i), *blob.encode_parts(key(i), 16, state(i, size)))


def test_ram_tier_evicts_least_recently_used_within_budget():
    ram = RamTier(3000)
    for i in range(3):
        assert ram.put(key(i), StateBlob(16, state(i)))
    assert ram.get(key(0)) is not None  # 0 is now the most recent
    ram.put(key(3), StateBlob(16, state(3)))
    assert ram.get(key(1)) is None
    assert all(ram.get(key(i)) is not None for i in (0, 2, 3))
    assert ram.used_bytes == 3000 and ram.evictions == 1 and ram.evicted_bytes == 1000
    assert not ram.put(key(9), StateBlob(16, state(9, 3001)))


def test_disk_round_trip_survives_a_new_instance(tmp_path):
    assert put(DiskTier(tmp_path, 10**6), 1) > 0
    reopened = DiskTier(tmp_path, 10**6)
    assert reopened.get(key(1)) == StateBlob(16, state(1))
    assert reopened.get(key(2)) is None


def test_disk_never_rewrites_an_entry(tmp_path):
    disk = DiskTier(tmp_path, 10**6)
    assert put(disk, 1) > 0
    before = disk.path_for(key(1)).stat().st_ino
    assert disk.put(key(1), *blob.encode_parts(key(1), 16, state(7))) == 0
    assert disk.path_for(key(1)).stat().st_ino == before
    assert disk.get(key(1)).state == state(1)


def _damage_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_and_truncated_files_are_misses_and_deleted(tmp_path):
    disk = DiskTier(tmp_path, 10**6)
    for i, damage in ((1, _damage_truncate), (2, _damage_flip)):
        put(disk, i)
        damage(disk.path_for(key(i)))
        assert disk.get(key(i)) is None
        assert not disk.path_for(key(i)).exists()
    assert disk.corrupt_deleted == 2
    assert put(disk, 1) > 0  # the slot is free again
    assert disk.get(key(1)).state == state(1)


def test_disk_budget_holds_under_a_stream_of_distinct_documents(tmp_path):
    entry = blob.HEADER_BYTES + 1000
    disk = DiskTier(tmp_path, 10 * entry)
    for i in range(60):
        put(disk, i)
        if i == 30:
            assert disk.get(key(25)) is not None  # used recently: must outlive its peers
        usage = disk.usage()
        assert usage.bytes <= disk.budget_bytes
    assert usage.files == 10
    assert disk.get(key(59)) is not None and disk.get(key(0)) is None
    assert disk.get(key(25)) is None  # its use was long ago by the end
    assert disk.evictions == 50


def test_disk_lru_keeps_touched_entries(tmp_path):
    entry = blob.HEADER_BYTES + 1000
    disk = DiskTier(tmp_path, 3 * entry)
    for i in range(3):
        put(disk, i)
        time.sleep(0.01)
    disk.get(key(0))
    put(disk, 3)
    assert disk.contains(key(0)) and not disk.contains(key(1))


def test_disk_skips_an_entry_larger_than_the_budget(tmp_path):
    disk = DiskTier(tmp_path, 500)
    assert put(disk, 1) == 0
    assert disk.usage().files == 0


def test_stale_temp_files_are_removed_on_open(tmp_path):
    DiskTier(tmp_path, 10**6)
    stale = tmp_path / "tmp" / "old.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    DiskTier(tmp_path, 10**6)
    assert not stale.exists()


_WRITER = """
import sys
from pathlib import Path
from node.cache import blob
from node.cache.disk import DiskTier
directory, worker, budget = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
disk = DiskTier(directory, budget)
misses = 0
for i in range(150):
    n = worker * 1000 + i
    k = n.to_bytes(4, "big") * 8
    disk.put(k, *blob.encode_parts(k, 16, bytes([n % 256]) * (500 + n % 700)))
    # read back what the other process wrote lately: present and valid, or a clean miss
    other = (1 - worker) * 1000 + i
    o = other.to_bytes(4, "big") * 8
    got = disk.get(o)
    if got is not None:
        assert got.state == bytes([other % 256]) * (500 + other % 700), "wrong bytes"
print(disk.corrupt_deleted)
"""


def test_two_processes_share_one_directory(tmp_path):
    budget = 20_000
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(worker), str(budget)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for worker in (0, 1)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "0"  # no process ever saw a torn or damaged file
    disk = DiskTier(tmp_path, budget)
    usage = disk.usage()
    assert 0 < usage.bytes <= budget
    for path in (tmp_path / "kv").iterdir():
        k = bytes.fromhex(path.name.removesuffix(".kvs"))
        assert disk.get(k) is not None
    assert list((tmp_path / "tmp").iterdir()) == []
