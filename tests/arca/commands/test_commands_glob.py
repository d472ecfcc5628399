"""Glob matching (KEYS, SCAN MATCH, CONFIG GET): Redis's semantics, bounded work, KEYS in slices."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time

import pytest

from arca.commands.glob import STAR_NESTING_LIMIT, Glob, compile_glob
from arca.commands.keys import matching_keys
from arca.commands.registry import Incremental
from arca_harness import run

# (pattern, key, matches): each row as redis-server 7 answers it (test_table_agrees_with_redis
# replays the table against a real one where it is installed).
TABLE = [
    (b"", b"", True),
    (b"", b"a", False),
    (b"*", b"", True),
    (b"**", b"", False),  # Redis: an empty key matches only `*` alone
    (b"?", b"", False),
    (b"*", b"anything", True),
    (b"a*", b"a", True),
    (b"a*", b"ab", True),
    (b"a*", b"ba", False),
    (b"*a", b"ba", True),
    (b"*a", b"ab", False),
    (b"a*b", b"ab", True),
    (b"a*b", b"axxb", True),
    (b"a*b", b"axxbx", False),
    (b"a**b", b"axb", True),
    (b"*a*b*c*", b"xaybzc", True),
    (b"*a*b*c*", b"xaycb", False),
    (b"a?c", b"abc", True),
    (b"a?c", b"ac", False),
    (b"a?c", b"a\x00c", True),
    (b"???", b"ab", False),
    (b"h[ae]llo", b"hello", True),
    (b"h[ae]llo", b"hillo", False),
    (b"h[^e]llo", b"hallo", True),
    (b"h[^e]llo", b"hello", False),
    (b"h[a-b]llo", b"hbllo", True),
    (b"h[b-a]llo", b"hbllo", True),  # a reversed range is the same range
    (b"h[a-b]llo", b"hcllo", False),
    (b"[]a]", b"a", False),  # `]` first closes an empty set: nothing matches
    (b"[]a]", b"]a]", False),
    (b"[^]", b"x", True),  # ... and its negation matches any byte
    (b"[a-]", b"a", True),  # `a-]` is a range from `a` to `]`
    (b"[a-]", b"^", True),
    (b"[a-]", b"-", False),
    (b"[a-]]", b"a", True),
    (b"[abc", b"b", True),  # a set never closed runs to the end of the pattern
    (b"[abc", b"bx", False),
    (b"[", b"[", False),
    (b"[\\]]", b"]", True),
    (b"[\\", b"\\", True),
    (b"[a\\-z]", b"-", True),
    (b"[a\\-z]", b"m", False),
    (b"\\*", b"*", True),
    (b"\\*", b"x", False),
    (b"\\?x", b"?x", True),
    (b"\\?x", b"ax", False),
    (b"a\\", b"a\\", True),  # a trailing backslash is itself
    (b"\\[a]", b"[a]", True),
    (b"\\a", b"a", True),
    (b"[a-\xff]", b"b", False),  # Redis compares signed chars: 0xff sorts below `a`
    (b"[a-\xff]", b"\x00", True),
    (b"[a-\xff]", b"\x80", False),
    (b"[\x80-\xff]", b"\xff", True),
    (b"[^a-\xff]", b"b", True),
    (b"user:*", b"user:42", True),
    (b"user:*", b"users:42", False),
    (b"*:*:*", b"a:b:c", True),
    (b"*:*:*", b"a:b", False),
    (b"*x" * STAR_NESTING_LIMIT, b"x" * 1200, True),
    (b"*x" * (STAR_NESTING_LIMIT + 1), b"x" * 1200, False),  # Redis's nesting limit
    (b"*x" * (STAR_NESTING_LIMIT + 1) + b"*", b"x" * 1200, False),
    (b"*" * 5000, b"x", True),  # consecutive stars are one star
]


@pytest.mark.parametrize("pattern, key, expected", TABLE)
def test_glob_table(pattern, key, expected):
    assert compile_glob(pattern)(key) is expected


# -- the work is bounded by pattern x key ------------------------------------------------

ADVERSARIAL = [
    b"*a" * 10 + b"b",  # each star must try every place: exponential when backtracking
    b"*a*a*a*a*a*a*a*a*a*a*a*a*b",
    b"a*" * 30 + b"b",
    b"*?" * 20 + b"b",
    b"*[a-z]" * 20 + b"b",
    b"*aaaaaaaaab*",
    b"*" + b"a" * 50 + b"b*",
]


@pytest.mark.parametrize("pattern", ADVERSARIAL)
def test_adversarial_patterns_cost_at_most_pattern_times_key(pattern):
    glob = compile_glob(pattern)
    for length in (1000, 4000, 16000):
        key = b"a" * length
        matched, steps = glob.steps(key)
        assert not matched
        assert steps <= (len(pattern) + 1) * (length + 1), (length, steps)
    # Linear in the key: four times the key is about four times the work, not more.
    _, small = glob.steps(b"a" * 4000)
    _, large = glob.steps(b"a" * 16000)
    assert large <= 4 * small + 4 * len(pattern) ** 2


def test_more_stars_cost_linearly_more():
    key = b"a" * 5000
    costs = [compile_glob(b"*a" * stars + b"b").steps(key)[1] for stars in (2, 4, 8, 16)]
    # Each segment is searched once: the work grows with the pattern, never multiplies.
    for fewer, more in zip(costs, costs[1:]):
        assert more <= 2 * fewer + 64
    assert costs[-1] <= 17 * (len(key) + 1)


@pytest.mark.parametrize("regex_atoms", [256, 0])  # 0: every segment matched token by token
def test_matches_agree_with_brute_force_on_random_patterns(monkeypatch, regex_atoms):
    """An obviously correct (exponential) recursive matcher over tokens, on small inputs."""
    import arca.commands.glob as glob_module

    monkeypatch.setattr(glob_module, "REGEX_ATOMS", regex_atoms)
    rng = random.Random(7)
    alphabet, key_alphabet = b"ab*?[]^-\\", b"ab-]^*"

    def reference(tokens, key):
        if not tokens:
            return not key
        head, rest = tokens[0], tokens[1:]
        if head is None:
            return any(reference(rest, key[i:]) for i in range(len(key) + 1))
        return bool(key) and head[key[0]] == 1 and reference(rest, key[1:])

    from arca.commands.glob import _tokens

    for _ in range(3000):
        pattern = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        key = bytes(rng.choice(key_alphabet) for _ in range(rng.randint(1, 6)))
        assert Glob(pattern)(key) == reference(_tokens(pattern), key), (pattern, key)


# -- against a real redis-server -----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_client(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the table is not replayed against Redis")
    import redis

    port = _free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.kill()
        process.wait()


def test_table_agrees_with_redis(redis_client):
    rng = random.Random(11)
    alphabet, key_alphabet = b"ab*?[]^-\\\x80\xff", b"ab-]^\\*?[\x80\xff\x00"
    keys = sorted({key for _, key, _ in TABLE} | {
        bytes(rng.choice(key_alphabet) for _ in range(rng.randint(1, 5))) for _ in range(200)})
    patterns = [pattern for pattern, _, _ in TABLE] + [
        bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(500)]
    redis_client.mset({key: b"1" for key in keys})
    for pattern in patterns:
        theirs = set(redis_client.keys(pattern))
        glob = compile_glob(pattern)
        assert {key for key in keys if glob(key)} == theirs, pattern
    for pattern, key, expected in TABLE:
        assert (key in set(redis_client.keys(pattern))) is expected, (pattern, key)


# -- KEYS runs in slices -----------------------------------------------------------------

def test_keys_yields_after_a_bounded_slice_of_work(ctx):
    for i in range(3000):
        ctx.archive.put(b"key:%05d" % i, b"v")
    steps = matching_keys(ctx.archive, compile_glob(b"key:*7"), budget=4096)
    slices = 0
    try:
        while True:
            next(steps)
            slices += 1
    except StopIteration as done:
        found = done.value
    assert sorted(found) == [b"key:%05d" % i for i in range(3000) if i % 10 == 7]
    assert slices >= 3000 * 9 // 4096
    reply = run(ctx, "KEYS", "key:0000*")
    assert sorted(reply) == [b"key:%05d" % i for i in range(10)]


def test_keys_over_a_big_keyspace_lets_other_clients_in(arca, monkeypatch):
    """While one client's KEYS works through its slices, another client's commands run."""
    import arca.commands.keys as keys_module

    monkeypatch.setattr(keys_module, "KEYS_SLICE_WORK", 2000)  # ~15 keys a slice
    keys = 20_000
    arca.call(lambda: [arca.archive.put(b"k:%06d:" % i + b"x" * 40, b"v") for i in range(keys)])
    stats = arca.state.stats
    seen: list[tuple[int, int]] = []  # (slice, commands processed by then), from the server thread
    original = Incremental.step

    def recording(self):
        seen.append((self.slices, stats.commands_processed))
        return original(self)

    monkeypatch.setattr(Incremental, "step", recording)
    with arca.connect() as slow, arca.connect() as other:
        slow.sendall(b"KEYS *7*\r\nPING\r\n")
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.001)
        other.sendall(b"PING\r\n")
        other.settimeout(10)
        assert other.recv(64) == b"+PONG\r\n"
        data = b""
        slow.settimeout(30)
        while not data.endswith(b"+PONG\r\n"):
            chunk = slow.recv(1 << 20)
            assert chunk
            data += chunk
    assert data.startswith(b"*%d\r\n" % sum(1 for i in range(keys) if b"7" in b"%06d" % i))
    assert len(seen) > 100  # many slices...
    first_count = seen[0][1]
    assert any(count > first_count for _, count in seen[:-1])  # ...and the other PING ran between them


def test_keys_inside_multi_runs_whole(ctx):
    for i in range(100):
        ctx.archive.put(b"m%d" % i, b"v")
    assert run(ctx, "MULTI") == "OK"
    run(ctx, "KEYS", "m9*")
    assert sorted(run(ctx, "EXEC")[0]) == sorted([b"m9"] + [b"m9%d" % i for i in range(10)])


def test_an_adversarial_pattern_matches_in_bounded_wall_time():
    """Not the step counter the matcher keeps itself: the clock. Many stars over a long key that
    almost matches is what makes a backtracking glob matcher exponential (Redis bounds it too)."""
    pattern = compile_glob(b"*a" * 24 + b"b")
    key = b"a" * 16_000
    start = time.perf_counter()
    matched, _ = pattern.steps(key)
    elapsed = time.perf_counter() - start
    assert not matched
    assert elapsed < 2.0, f"{elapsed:.2f} s for one adversarial match"
