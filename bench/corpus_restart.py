"""Archive corpus and L1 costs, each beside its baseline, in one run.

1. Restart: build a corpus of --tokens tokens (default 10M), close, reopen; the reopen (read
   every stream + rebuild the n-gram index) against reading the same rows without indexing,
   and against the 10 s target.
2. DRAFT in-process on a --draft-tokens corpus (default 1M): p50/p99 of Archive.draft against
   a vectorized numpy scan for the tail's last 3-gram (the C++ original's lookup).
3. L1: put/get per call against a plain dict; one commit of 50 writes (append log) against
   50 upserts into the keyed table per commit.
4. L1 log: --l1-writes random writes over 100k keys in commits of 1000, with log rewrites
   (the default) and with rewrites switched off: time, log records, file size, reopen time.

    .venv/bin/python bench/corpus_restart.py [--tokens N] [--draft-tokens N] [--l1-writes N]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from arca.archive import Archive, ArchiveConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.host import host_line  # noqa: E402


def synthetic_streams(total: int, seed: int = 0):
    """Generations made of recurring phrases with some noise: text-like repetition."""
    rng = np.random.default_rng(seed)
    phrases = (rng.zipf(1.3, size=(4000, 12)) % 32000).astype("<u4")
    made = 0
    while made < total:
        stream = phrases[rng.integers(0, len(phrases), size=int(rng.integers(10, 50)))].reshape(-1).copy()
        stream[rng.integers(0, len(stream), size=len(stream) // 10)] = rng.integers(0, 32000, size=len(stream) // 10)
        made += len(stream)
        yield stream


def build(directory: Path, tokens: int) -> tuple[ArchiveConfig, float]:
    config = ArchiveConfig(directory=directory, corpus_max_bytes=4 * tokens + (1 << 20))
    started = time.perf_counter()
    with Archive(config) as arc:
        for count, stream in enumerate(synthetic_streams(tokens), 1):
            arc.observe(b"bench", stream.tobytes())
            if count % 64 == 0:
                arc.commit()
    return config, time.perf_counter() - started


def restart(tokens: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config, built = build(Path(tmp), tokens)
        started = time.perf_counter()
        with sqlite3.connect(config.database_path) as conn:
            rows = conn.execute("SELECT id, ns, tokens, crc FROM corpus_streams ORDER BY id").fetchall()
            np.concatenate([np.frombuffer(row[2], dtype="<u4") for row in rows])
        raw = time.perf_counter() - started
        started = time.perf_counter()
        arc = Archive(config)
        reopen = time.perf_counter() - started
        stats = arc.info()["arca"]
        arc.close()
    print(f"restart  corpus {stats['corpus_tokens']:,} tokens in {stats['corpus_streams']:,} streams "
          f"(observed in {built:.1f} s), index RAM {stats['corpus_index_ram_bytes'] / 2**20:.0f} MiB")
    print(f"restart  reopen {reopen:.2f} s | raw row read {raw:.2f} s | ratio {reopen / raw:.1f}x raw, "
          f"{reopen / 10:.2f} of the 10 s target")


def scan_baseline(tokens: np.ndarray, tail: list[int], k: int) -> list[int] | None:
    a, b, c = tail[-3:]
    hits = np.flatnonzero((tokens[:-3] == a) & (tokens[1:-2] == b) & (tokens[2:-1] == c))
    if not len(hits):
        return None
    start = int(hits[-1]) + 3
    return tokens[start:start + k].tolist()


def draft_latency(tokens: int) -> None:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        config, _ = build(Path(tmp), tokens)
        with Archive(config) as arc:
            flat = np.concatenate([np.frombuffer(p, dtype="<u4") for _, p in arc.since(b"bench", 0, 10**7)])
            tails = []
            for _ in range(2000):
                at = rng.randrange(8, len(flat) - 8)
                tails.append(flat[at - rng.randrange(3, 9):at].tolist())
            ours, base, hits = [], [], 0
            for tail in tails:
                started = time.perf_counter()
                hits += arc.draft(b"bench", tail, 8) is not None
                ours.append(time.perf_counter() - started)
            for tail in tails[:200]:
                started = time.perf_counter()
                scan_baseline(flat, tail, 8)
                base.append(time.perf_counter() - started)
    p50, p99 = statistics.median(ours) * 1e6, np.percentile(ours, 99) * 1e6
    b50 = statistics.median(base) * 1e6
    print(f"draft    {len(flat):,}-token corpus: p50 {p50:.1f} us, p99 {p99:.1f} us, hits {hits}/{len(tails)} "
          f"| numpy 3-gram scan p50 {b50:.0f} us | ratio {b50 / p50:.0f}x faster")


def l1_costs() -> None:
    n = 200_000
    keys = [b"key:%012d" % i for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp, Archive(ArchiveConfig(directory=tmp)) as arc:
        started = time.perf_counter()
        for key in keys:
            arc.put(key, b"xxx")
        put = (time.perf_counter() - started) / n * 1e6
        arc.compact()                       # start from a folded log, as after idle time
        started = time.perf_counter()
        for key in keys:
            arc.get(key)
        get = (time.perf_counter() - started) / n * 1e6
        rng = random.Random(2)
        ticks = 1000
        started = time.perf_counter()
        for _ in range(ticks):
            for _ in range(50):
                arc.put(keys[rng.randrange(n)], b"yyy")
            arc.commit()
        commit = (time.perf_counter() - started) / ticks * 1e6
    plain: dict[bytes, bytes] = {}
    started = time.perf_counter()
    for key in keys:
        plain[key] = b"xxx"
    dict_put = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for key in keys:
        plain.get(key)
    dict_get = (time.perf_counter() - started) / n * 1e6
    upsert = keyed_upsert_commit(keys, ticks)
    print(f"l1       put {put:.2f} us (dict {dict_put:.2f} us, {put / dict_put:.1f}x) | "
          f"get {get:.2f} us (dict {dict_get:.2f} us, {get / dict_get:.1f}x)")
    print(f"l1       commit of 50 random writes over {n:,} keys: {commit:.0f} us | "
          f"50 upserts into the keyed table {upsert:.0f} us | ratio {upsert / commit:.1f}x")


def l1_log(writes: int, keys: int = 100_000, per_commit: int = 1000) -> None:
    results = {}
    for label, rewrite_after in (("rewrites", None), ("no rewrites", 10**15)):
        rng = random.Random(3)
        with tempfile.TemporaryDirectory() as tmp:
            config = ArchiveConfig(directory=Path(tmp))
            with Archive(config) as arc:
                if rewrite_after is not None:
                    arc._entries.log.rewrite_after = rewrite_after
                started = time.perf_counter()
                for done in range(0, writes, per_commit):
                    for _ in range(per_commit):
                        arc.put(b"key:%09d" % rng.randrange(keys), b"value-%012d" % done)
                    arc.commit()
                elapsed = time.perf_counter() - started
                records = arc.log_records
            size = sum(f.stat().st_size for f in Path(tmp).glob("archive.db*"))
            started = time.perf_counter()
            with Archive(config) as arc:
                reopen = time.perf_counter() - started
                assert len(arc._entries) == keys
            results[label] = (elapsed, records, size, reopen)
            print(f"l1 log   {label:<11}: {writes:,} writes over {keys:,} keys in {elapsed:.2f} s "
                  f"({elapsed / writes * 1e6:.2f} us each) | log {records:,} records, files "
                  f"{size / 2**20:.0f} MiB | reopen {reopen:.2f} s")
    (t1, r1, s1, o1), (t0, r0, s0, o0) = results["rewrites"], results["no rewrites"]
    print(f"l1 log   rewrites: write time {t1 / t0:.2f}x, log {r0 / r1:.1f}x shorter, files "
          f"{s0 / s1:.1f}x smaller, reopen {o0 / o1:.1f}x faster")


def keyed_upsert_commit(keys: list[bytes], ticks: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "keyed.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-16384")
        conn.execute("CREATE TABLE entries (key BLOB NOT NULL UNIQUE, value BLOB NOT NULL, expire_at INTEGER, crc INTEGER)")
        sql = "INSERT OR REPLACE INTO entries VALUES (?, ?, NULL, ?)"
        conn.execute("BEGIN")
        conn.executemany(sql, [(key, b"xxx", zlib.crc32(b"xxx")) for key in keys])
        conn.execute("COMMIT")
        rng = random.Random(2)
        started = time.perf_counter()
        for _ in range(ticks):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(sql, [(keys[rng.randrange(len(keys))], b"yyy", 0) for _ in range(50)])
            conn.execute("COMMIT")
        elapsed = (time.perf_counter() - started) / ticks * 1e6
        conn.close()
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--draft-tokens", type=int, default=1_000_000)
    parser.add_argument("--l1-writes", type=int, default=3_000_000)
    args = parser.parse_args()
    print(host_line(), flush=True)
    l1_costs()
    l1_log(args.l1_writes)
    draft_latency(args.draft_tokens)
    restart(args.tokens)


if __name__ == "__main__":
    main()
