"""arca.archive._l1table.Table against a pure-Python model of its specification.

The model (`Model`) implements the documented behaviour with an OrderedDict (least recently
used first): byte accounting of len(key) + len(value) + overhead per entry, eviction while
used_bytes > max_bytes, lazy expiry on reads, the dirty list (compared as a set of keys: the
table may list a key more than once), the counters, the packed records of encode() and the
GET/SET pipeline of run(). A snapshot() read back later holds, in order, every key of the
moment it was taken that has been present ever since, and only keys present now (a key
written meanwhile may appear: the table records slots, not keys). expire_due(limit)
removes min(limit, due) entries whose deadline has passed, each counted as expired (which
of them, when more are due than the limit, the model leaves open).

Deadlines are either far in the future or in 1970, so expiry never depends on the clock
moving during a test.
"""

from __future__ import annotations

import struct
import sys
import time
from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from arca.archive._l1table import Table

RECORD = struct.Struct("<IiQ")
FUTURE = 4_102_444_800_000          # 2100-01-01, in ms
PAST = 1                            # 1970: always expired


# --------------------------------------------------------------------------- reference model

class Model:
    """What the specification says a Table does."""

    def __init__(self, max_bytes: int, overhead: int):
        self.max_bytes = max_bytes
        self.overhead = overhead
        self.entries: OrderedDict[bytes, tuple[bytes, int | None]] = OrderedDict()
        self.used_bytes = 0
        self.hits = self.misses = self.evicted = self.expired = 0
        self.dirty: set[bytes] = set()
        self.removals: list[bytes] = []   # every key removed, in order (for snapshots)

    # -- helpers
    def _size(self, key: bytes, value: bytes) -> int:
        return len(key) + len(value) + self.overhead

    def _remove(self, key: bytes) -> None:
        value, _ = self.entries.pop(key)
        self.used_bytes -= self._size(key, value)
        self.dirty.add(key)
        self.removals.append(key)

    def _lazy_expire(self, key: bytes) -> bool:
        """True when the key is present and live after the lazy expiry check."""
        entry = self.entries.get(key)
        if entry is None:
            return False
        if entry[1] is not None and entry[1] <= now_ms():
            self._remove(key)
            self.expired += 1
            return False
        return True

    # -- API
    @property
    def ttl_count(self) -> int:
        return sum(1 for _, d in self.entries.values() if d is not None)

    def __len__(self) -> int:
        return len(self.entries)

    def get_with_deadline(self, key: bytes):
        if not self._lazy_expire(key):
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return self.entries[key]

    def get(self, key: bytes):
        found = self.get_with_deadline(key)
        return None if found is None else found[0]

    def deadline(self, key: bytes):
        entry = self.entries.get(key)
        return None if entry is None else entry[1]

    def contains(self, key: bytes) -> bool:
        return self._lazy_expire(key)

    def snapshot_keys(self, taken: list[bytes], removals_then: int) -> tuple[list[bytes], set[bytes]]:
        """What a snapshot taken when the keys were `taken` (and `removals_then` removals had
        happened) must yield now, in order, and the keys it may yield."""
        removed = set(self.removals[removals_then:])
        return [key for key in taken if key in self.entries and key not in removed], set(self.entries)

    def put(self, key: bytes, value: bytes, deadline=None) -> None:
        if key in self.entries:
            old, _ = self.entries.pop(key)
            self.used_bytes -= self._size(key, old)
        self.entries[key] = (value, deadline)
        self.used_bytes += self._size(key, value)
        self.dirty.add(key)
        self.evict()

    def set_deadline(self, key: bytes, deadline) -> bool:
        entry = self.entries.get(key)
        if entry is None:
            return False
        self.entries[key] = (entry[0], deadline)     # assignment keeps the LRU position
        self.dirty.add(key)
        return True

    def delete(self, key: bytes) -> bool:
        if key not in self.entries:
            return False
        self._remove(key)
        return True

    def expire(self, key: bytes) -> bool:
        if not self.delete(key):
            return False
        self.expired += 1
        return True

    def evict(self) -> int:
        count = 0
        while self.used_bytes > self.max_bytes and self.entries:
            key = next(iter(self.entries))
            self._remove(key)
            self.evicted += 1
            count += 1
        return count

    def keys(self) -> list[bytes]:
        return list(self.entries)

    def due(self, now: int) -> set[bytes]:
        return {k for k, (_, d) in self.entries.items() if d is not None and d <= now}

    def ttl_items(self) -> list[tuple[int, bytes]]:
        return [(d, k) for k, (_, d) in self.entries.items() if d is not None]

    def clear(self) -> None:
        self.removals += self.entries
        self.entries.clear()
        self.used_bytes = 0
        self.dirty.clear()

    def clear_dirty(self) -> None:
        self.dirty.clear()

    def encode(self, keys) -> bytes:
        parts = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                parts.append(RECORD.pack(len(key), -1, 0) + key)
            else:
                value, deadline = entry
                parts.append(RECORD.pack(len(key), len(value), deadline or 0) + key + value)
        return b"".join(parts)

    def _add(self, argv: list[bytes], name: bytes) -> int | None:
        """INCR/DECR/INCRBY/DECRBY as the spec gives them; None where the table must stop."""
        delta = 1 if name.startswith(b"incr") else -1
        if len(argv) == 3:
            amount = strict_int(argv[2])
            if amount is None or (delta < 0 and amount == -(2**63)):
                return None
            delta *= amount
        key = argv[1]
        current, deadline = 0, None
        if self._lazy_expire(key):
            current = strict_int(self.entries[key][0])
            if current is None:
                return None
            deadline = self.entries[key][1]
        result = current + delta
        if not -(2**63) <= result < 2**63 or len(key) + 20 + self.overhead > self.max_bytes:
            return None
        self.get(key)  # counted as one read, like the general path
        self.put(key, b"%d" % result, deadline)
        return result

    def run(self, data: bytes, resp: int, out_cap: int, max_bulk: int, max_items: int = 1 << 20):
        reply = bytearray()
        consumed = count = 0
        last = None

        def read(key: bytes) -> bytes:
            value = self.get(key)
            if value is None:
                return b"_\r\n" if resp == 3 else b"$-1\r\n"
            return b"$%d\r\n%s\r\n" % (len(value), value)

        while True:
            if len(reply) > out_cap:
                break
            line_end = data.find(b"\n", consumed)
            if data[consumed:consumed + 1] != b"*" and line_end >= 0 and \
                    data[consumed:line_end].removesuffix(b"\r").lower() == b"ping" and line_end - consumed in (4, 5):
                reply += b"+PONG\r\n"
                consumed, count, last = line_end + 1, count + 1, b"ping"
                continue
            parsed = parse_command(data, consumed, max_bulk, max_items)
            if parsed is None:
                break
            argv, end = parsed
            name = argv[0].lower()
            if name == b"ping" and len(argv) == 1:
                reply += b"+PONG\r\n"
            elif name == b"get" and len(argv) == 2:
                reply += read(argv[1])
            elif name == b"mget" and len(argv) >= 2:
                reply += b"*%d\r\n" % (len(argv) - 1) + b"".join(read(key) for key in argv[1:])
            elif (name in (b"incr", b"decr") and len(argv) == 2) or (name in (b"incrby", b"decrby") and len(argv) == 3):
                result = self._add(argv, name)
                if result is None:
                    break  # left for the general path, which answers the error
                reply += b":%d\r\n" % result
            elif name == b"mset" and len(argv) >= 3 and len(argv) % 2 == 1:
                pairs = list(zip(argv[1::2], argv[2::2]))
                if any(self._size(key, value) > self.max_bytes for key, value in pairs):
                    break
                for key, value in pairs:
                    self.put(key, value)
                reply += b"+OK\r\n"
            elif name == b"set" and len(argv) == 3:
                if self._size(argv[1], argv[2]) > self.max_bytes:
                    break
                self.put(argv[1], argv[2])
                reply += b"+OK\r\n"
            else:
                break
            consumed, count, last = end, count + 1, name
            if len(reply) > out_cap:
                break
        return bytes(reply), consumed, count, last


def strict_int(text: bytes) -> int | None:
    """Redis's string2ll: a signed 64-bit integer spelled canonically, else None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if -(2**63) <= value < 2**63 and b"%d" % value == text else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _read_length(data: bytes, pos: int):
    """A canonical decimal length at `pos` ending in CRLF: (value, position after CRLF) or None."""
    end = data.find(b"\r\n", pos)
    if end < 0:
        return None
    digits = data[pos:end]
    if not digits or not digits.isdigit() or (len(digits) > 1 and digits[:1] == b"0"):
        return None
    # isdigit() on bytes is ASCII-only, so int() cannot see anything but 0-9 here.
    return int(digits), end + 2


def parse_command(data: bytes, pos: int, max_bulk: int, max_items: int = 1 << 20):
    """A complete canonical multibulk of 1 to max_items bulks at `pos`: (argv, end) or None."""
    if data[pos:pos + 1] != b"*":
        return None
    read = _read_length(data, pos + 1)
    if read is None or not 1 <= read[0] <= max_items:
        return None
    n, pos = read
    argv = []
    for _ in range(n):
        if data[pos:pos + 1] != b"$":
            return None
        read = _read_length(data, pos + 1)
        if read is None or read[0] > max_bulk:
            return None
        length, pos = read
        if len(data) < pos + length + 2 or data[pos + length:pos + length + 2] != b"\r\n":
            return None
        argv.append(data[pos:pos + length])
        pos += length + 2
    return argv, pos


def multibulk(*argv: bytes) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in argv)


def state(obj) -> dict:
    """Everything observable about a Table (or the model) that does not change it."""
    return {
        "len": len(obj),
        "used_bytes": obj.used_bytes,
        "max_bytes": obj.max_bytes,
        "overhead": obj.overhead,
        "hits": obj.hits,
        "misses": obj.misses,
        "evicted": obj.evicted,
        "expired": obj.expired,
        "ttl_count": obj.ttl_count,
        "dirty": set(obj.dirty),
        "keys": obj.keys(),
        "ttl_items": sorted(obj.ttl_items()),
        "deadlines": {k: obj.deadline(k) for k in obj.keys()},
    }


def assert_same(table: Table, model: Model) -> None:
    assert state(table) == state(model)
    assert model.used_bytes == sum(model._size(k, v) for k, (v, _) in model.entries.items())


def test_model_parser_sanity():
    """The model's own parser accepts what it should (guards the model, not the table)."""
    assert parse_command(multibulk(b"GET", b"k"), 0, 10) == ([b"GET", b"k"], len(multibulk(b"GET", b"k")))
    assert parse_command(multibulk(b"SET", b"k", b""), 0, 10)[0] == [b"SET", b"k", b""]
    assert parse_command(b"*2\r\n$03\r\nGET\r\n$1\r\nk\r\n", 0, 10) is None
    assert parse_command(b"*2\r\n$3\r\nGET\r\n$1\r\nk", 0, 10) is None
    assert parse_command(multibulk(b"GET", b"k" * 11), 0, 10) is None


# --------------------------------------------------------------------------- state machine

KEYS = st.sampled_from([b"", b"a", b"b", b"c", b"ab", b"\r\n", b"\x00\xff", b"key:" + b"x" * 28])
VALUES = st.one_of(
    st.sampled_from([b"", b"v", b"\r\n", b"a\r\nb", b"$-1\r\n", b"*2\r\n", b"\x00" * 7, b"z" * 120]),
    st.binary(max_size=40),
)
DEADLINES = st.one_of(
    st.none(),
    st.integers(min_value=1, max_value=1_000_000),                    # long past
    st.integers(min_value=FUTURE, max_value=FUTURE + 10**12),         # far future
)
NAMES = {b"get": [b"GET", b"get", b"Get", b"gEt"], b"set": [b"SET", b"set", b"Set", b"sEt"],
         b"mget": [b"MGET", b"mget", b"mGet"], b"ping": [b"PING", b"ping"], b"mset": [b"MSET", b"mset"],
         b"incr": [b"INCR", b"incr", b"DECR", b"decr"], b"incrby": [b"INCRBY", b"incrBy", b"DECRBY", b"decrby"]}
NUMBERS = st.sampled_from([b"0", b"1", b"-1", b"42", b"9223372036854775807", b"-9223372036854775808",
                           b"007", b"-0", b"+1", b" 1", b"1.5", b"x", b""])


@st.composite
def pipelines(draw):
    """A RESP byte stream: GET/SET commands, sometimes with things that must stop run()."""
    parts = []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        kind = draw(st.sampled_from(["get", "get", "set", "set", "mget", "ping", "mset", "incr", "incrby",
                                     "setnum", "inline_ping", "stop", "junk"]))
        if kind == "get":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"get"])), draw(KEYS)))
        elif kind == "mget":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"mget"])), *draw(st.lists(KEYS, min_size=1, max_size=4))))
        elif kind == "ping":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"ping"]))))
        elif kind == "inline_ping":
            parts.append(draw(st.sampled_from([b"PING\r\n", b"ping\n", b"PiNg\r\n"])))
        elif kind == "mset":
            pairs = draw(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3))
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"mset"])), *[x for pair in pairs for x in pair]))
        elif kind == "incr":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"incr"])), draw(KEYS)))
        elif kind == "incrby":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"incrby"])), draw(KEYS), draw(NUMBERS)))
        elif kind == "setnum":
            parts.append(multibulk(b"SET", draw(KEYS), draw(NUMBERS)))
        elif kind == "set":
            parts.append(multibulk(draw(st.sampled_from(NAMES[b"set"])), draw(KEYS), draw(VALUES)))
        elif kind == "stop":
            parts.append(draw(st.sampled_from(STOPPERS)))
        else:
            parts.append(draw(st.binary(max_size=12)))
    data = b"".join(parts)
    if draw(st.booleans()) and data:
        data = data[:draw(st.integers(min_value=0, max_value=len(data)))]   # cut anywhere
    return data


STOPPERS = [
    b"PING x\r\n",                                       # inline, other than a bare PING
    b" PING\r\n",
    b"GET a\r\n",                                        # inline GET
    multibulk(b"DEL", b"a"),
    multibulk(b"PING", b"hello"),                        # PING with a message
    multibulk(b"MGET"),                                  # MGET without keys
    multibulk(b"MSET", b"a"),                            # MSET without a value
    multibulk(b"MSET", b"a", b"1", b"b"),                # MSET with an odd argument count
    multibulk(b"INCR", b"a", b"b"),
    multibulk(b"INCRBY", b"a"),
    multibulk(b"GET", b"a", b"b"),
    multibulk(b"SET", b"a"),
    multibulk(b"SET", b"a", b"b", b"EX"),
    multibulk(b"GETX", b"a"),
    b"*2\r\n$03\r\nGET\r\n$1\r\na\r\n",                  # leading zero bulk length
    b"*02\r\n$3\r\nGET\r\n$1\r\na\r\n",                  # leading zero multibulk length
    b"*2\r\n$+3\r\nGET\r\n$1\r\na\r\n",
    b"*2\r\n$3\r\nGET\r\n$-1\r\n",
    b"*2\r\n$3\r\nGET\n$1\r\na\r\n",                     # bare LF
    b"*2\r\n$3\r\nGETxx$1\r\na\r\n",                     # bulk not followed by CRLF
    b"*2\r\n$ 3\r\nGET\r\n$1\r\na\r\n",
    b"*2\r\n$\r\nGET\r\n$1\r\na\r\n",
    b"*0\r\n",
    b"*-1\r\n",
    b"*2\r\n$99999999999999999999\r\n",
    b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$100\r\n" + b"v" * 100 + b"\r\n",   # over max_bulk when small
    b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$900\r\n" + b"w" * 900 + b"\r\n",  # over budget when small
    b"*2\r\n$3\r\nGET\r\n$1\r\na",                       # incomplete
    b"*",
    b"\r\n",
]


class TableMachine(RuleBasedStateMachine):
    table: Table
    model: Model

    @initialize(max_bytes=st.sampled_from([0, 60, 200, 500, 2000, 1 << 20]),
                overhead=st.sampled_from([0, 1, 16, 48]))
    def create(self, max_bytes, overhead):
        self.table = Table(max_bytes, overhead)
        self.model = Model(max_bytes, overhead)

    @invariant()
    def same_state(self):
        if hasattr(self, "table"):
            assert_same(self.table, self.model)

    def _fits(self, key, value):
        return self.model._size(key, value) <= self.model.max_bytes

    @rule(key=KEYS)
    def get(self, key):
        assert self.table.get(key) == self.model.get(key)

    @rule(key=KEYS)
    def get_with_deadline(self, key):
        assert self.table.get_with_deadline(key) == self.model.get_with_deadline(key)

    @rule(key=KEYS)
    def contains(self, key):
        assert self.table.contains(key) == self.model.contains(key)

    @rule(key=KEYS)
    def deadline(self, key):
        assert self.table.deadline(key) == self.model.deadline(key)

    @rule(key=KEYS, value=VALUES)
    def put(self, key, value):
        if self._fits(key, value):     # callers refuse entries over the budget
            assert self.table.put(key, value) is None
            self.model.put(key, value)

    @rule(key=KEYS, value=VALUES, deadline=DEADLINES)
    def put_with_deadline(self, key, value, deadline):
        if self._fits(key, value):
            assert self.table.put(key, value, deadline) is None
            self.model.put(key, value, deadline)

    @rule(key=KEYS, value=VALUES, deadline=DEADLINES)
    def put_keyword_deadline(self, key, value, deadline):
        if self._fits(key, value):
            assert self.table.put(key, value, deadline=deadline) is None
            self.model.put(key, value, deadline)

    @rule(key=KEYS, deadline=DEADLINES)
    def set_deadline(self, key, deadline):
        assert self.table.set_deadline(key, deadline) == self.model.set_deadline(key, deadline)

    @rule(key=KEYS)
    def delete(self, key):
        assert self.table.delete(key) == self.model.delete(key)

    @rule(key=KEYS)
    def expire(self, key):
        assert self.table.expire(key) == self.model.expire(key)

    @rule(fraction=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0, 1.5]), evict_now=st.booleans())
    def change_max_bytes(self, fraction, evict_now):
        new = int(self.model.used_bytes * fraction)
        self.table.max_bytes = new
        self.model.max_bytes = new
        if evict_now:
            assert self.table.evict() == self.model.evict()

    @rule(new=st.sampled_from([60, 500, 2000, 1 << 20]))
    def raise_max_bytes(self, new):
        self.table.max_bytes = new
        self.model.max_bytes = new

    @rule()
    def evict(self):
        assert self.table.evict() == self.model.evict()

    @rule(roll=st.integers(min_value=0, max_value=9))
    def clear(self, roll):
        if roll == 0:   # rarely, or the table would be empty most of the time
            assert self.table.clear() is None
            self.model.clear()

    @rule()
    def clear_dirty(self):
        assert self.table.clear_dirty() is None
        self.model.clear_dirty()
        assert self.table.dirty == []

    @rule()
    def keys(self):
        assert self.table.keys() == self.model.keys()

    @rule(limit=st.sampled_from([0, 1, 2, 1000]))
    def expire_due(self, limit):
        now = now_ms()
        due, before = self.model.due(now), set(self.table.keys())
        count = self.table.expire_due(limit, now)
        removed = before - set(self.table.keys())
        assert count == len(removed) == min(limit, len(due)) and removed <= due
        for key in self.table.keys() if limit >= len(due) else ():
            assert key not in due
        for key in removed:
            assert self.model.expire(key)

    @rule()
    def take_snapshot(self):
        snap = self.table.snapshot()
        assert snap[:] == self.model.keys() and len(snap) == len(self.model)
        self.snapshots = getattr(self, "snapshots", [])[-2:] + [(snap, self.model.keys(), len(self.model.removals))]

    @rule(which=st.integers(min_value=0, max_value=2))
    def read_snapshot(self, which):
        taken = getattr(self, "snapshots", [])
        if not taken:
            return
        snap, keys_then, removals_then = taken[which % len(taken)]
        must, may = self.model.snapshot_keys(keys_then, removals_then)
        got = snap[:]
        assert len(snap) == len(keys_then) and set(got) <= may and len(set(got)) == len(got)
        assert [key for key in got if key in must] == must
        assert [snap[i] for i in range(len(snap)) if snap[i] is not None] == got

    @rule(keys=st.lists(KEYS, max_size=6), as_generator=st.booleans())
    def encode(self, keys, as_generator):
        got = self.table.encode(iter(keys) if as_generator else keys)
        assert got == self.model.encode(keys)

    @rule(data=pipelines(), resp=st.sampled_from([2, 3]),
          out_cap=st.sampled_from([0, 5, 20, 64, 1 << 16]),
          max_bulk=st.sampled_from([3, 16, 64, 1 << 20]))
    def run(self, data, resp, out_cap, max_bulk):
        got = self.table.run(data, resp, out_cap, max_bulk)
        assert got == self.model.run(data, resp, out_cap, max_bulk)


TableMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=40, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTableMachine = TableMachine.TestCase


# --------------------------------------------------------------------------- basics

def test_snapshot_reads_back_keys_as_they_are_now():
    t = Table(1 << 20, 0)
    for key in (b"a", b"b", b"c", b"d"):
        t.put(key, key * 3)
    t.get(b"a")
    snap = t.snapshot()
    assert len(snap) == 4 and snap[:] == [b"b", b"c", b"d", b"a"] == t.keys()
    assert (snap[0], snap[-1], snap[1:3], snap[::2], snap[::-1]) == \
        (b"b", b"a", [b"c", b"d"], [b"b", b"d"], [b"a", b"d", b"c", b"b"])
    assert t.delete(b"c")
    assert snap[:] == [b"b", b"d", b"a"] and snap[1] is None and len(snap) == 4
    t.put(b"e", b"x")                             # may take c's slot: its hash differs
    assert snap[:] == [b"b", b"d", b"a"]
    t.put(b"c", b"again")                         # back, in another slot
    assert set(snap[:]) <= {b"b", b"c", b"d", b"a"} and snap[:3:2] == [b"b", b"d"]
    for bad in (4, -5):
        with pytest.raises(IndexError):
            snap[bad]
    with pytest.raises(TypeError):
        snap[b"x"]
    t.clear()
    assert snap[:] == [] and len(snap) == 4 and t.snapshot()[:] == [] and len(t.snapshot()) == 0


def test_expire_due_pops_the_deadline_heap():
    t = Table(1 << 20, 0)
    now = 10_000
    for i in range(10):
        t.put(b"k%d" % i, b"v", now - 90 + i * 20)        # k0..k4 due at `now`, k5..k9 later
    t.put(b"plain", b"v")
    t.set_deadline(b"k0", now + 10**6)                      # its old pair is stale now
    t.set_deadline(b"plain", now - 1)                        # due through set_deadline
    t.delete(b"k1")                                          # a pair for a freed slot
    t.clear_dirty()
    assert t.expire_due(2, now) == 2 and t.expired == 2
    assert t.expire_due(1000, now) == 2 and t.expired == 4
    assert set(t.dirty) == {b"plain", b"k2", b"k3", b"k4"}
    assert sorted(t.keys()) == [b"k0", b"k5", b"k6", b"k7", b"k8", b"k9"]
    assert t.expire_due(1000, now) == 0 and t.expire_due(0, now + 10**7) == 0
    assert t.expire_due(now=now + 10**7) == 6 and len(t) == 0 and t.ttl_count == 0


def test_deadline_heap_is_rebuilt_when_stale_pairs_pile_up():
    t = Table(1 << 30, 0)
    t.put(b"a", b"1", FUTURE)
    t.put(b"b", b"1", PAST + 5)
    for i in range(5000):                                    # 5000 stale pairs for one key
        t.set_deadline(b"a", FUTURE + i)
    t.clear_dirty()
    assert t.expire_due(10, now_ms()) == 1 and t.keys() == [b"a"]
    assert t.expire_due(now=FUTURE + 4998) == 0 and t.expire_due(now=FUTURE + 4999) == 1
    for i in range(3000):                                    # and keys gone with their pairs
        t.put(b"x%d" % i, b"v", FUTURE)
        t.delete(b"x%d" % i)
    t.put(b"c", b"v", PAST)
    assert t.expire_due(now=now_ms()) == 1 and len(t) == 0
    t.put(b"d", b"v", PAST)
    t.clear()
    assert t.expire_due(now=now_ms()) == 0


def test_dirty_epoch_wraps_without_losing_a_mark():
    t = Table(1 << 20, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"1")
    t._epoch = 2**32 - 2
    assert t.dirty == [] and t._epoch == 2**32 - 2
    t.put(b"a", b"2")
    assert t.dirty == [b"a"]
    for expected in (2**32 - 1, 1, 2):            # 0 is skipped; every old mark is reset
        t.clear_dirty()
        assert t._epoch == expected and t.dirty == []
        t.put(b"a", b"3")
        t.put(b"a", b"4")
        t.set_deadline(b"b", FUTURE)
        assert t.dirty == [b"a", b"b"]
    for bad in (0, 2**32, -1):
        with pytest.raises((ValueError, OverflowError)):
            t._epoch = bad


def test_values_are_stored_inline_and_replaced_in_place_or_not():
    t = Table(1 << 20, 0)
    t.put(b"k", b"abc")
    t.put(b"k", b"xyz")                           # same length: overwritten in place
    assert t.get(b"k") == b"xyz" and t.used_bytes == 4
    t.put(b"k", b"longer value" * 50, FUTURE)     # longer, a deadline appears: a new entry
    assert t.get_with_deadline(b"k") == (b"longer value" * 50, FUTURE) and t.ttl_count == 1
    t.put(b"k", b"short value!" * 50, FUTURE + 1)
    assert t.get_with_deadline(b"k") == (b"short value!" * 50, FUTURE + 1)
    t.set_deadline(b"k", None)
    assert t.get_with_deadline(b"k") == (b"short value!" * 50, None) and t.ttl_count == 0
    big = bytes(range(256)) * 1000                # long lengths take several varint bytes
    t.put(b"K" * 300, big)
    assert t.get(b"K" * 300) == big and t.keys() == [b"k", b"K" * 300]
    assert t.run(b"*2\r\n$3\r\nGET\r\n$300\r\n" + b"K" * 300 + b"\r\n", 2, 1 << 20, 1 << 20)[0] == \
        b"$256000\r\n" + big + b"\r\n"


def test_construction_and_attributes():
    t = Table(1000, 48)
    assert (t.max_bytes, t.overhead, t.used_bytes, len(t)) == (1000, 48, 0, 0)
    assert (t.hits, t.misses, t.evicted, t.expired, t.ttl_count) == (0, 0, 0, 0, 0)
    assert t.dirty == [] and type(t.dirty) is list
    assert t.keys() == [] and t.ttl_items() == []
    t.max_bytes = 5
    assert t.max_bytes == 5


@pytest.mark.parametrize("name", ["used_bytes", "hits", "misses", "evicted", "expired", "ttl_count"])
def test_counters_are_read_only(name):
    t = Table(1000, 0)
    with pytest.raises((AttributeError, TypeError)):
        setattr(t, name, 7)
    assert getattr(t, name) == 0


def test_byte_accounting_with_overhead():
    t = Table(10_000, 48)
    t.put(b"abc", b"12345")
    assert t.used_bytes == 3 + 5 + 48
    t.put(b"abc", b"1")                       # replace: old size removed
    assert t.used_bytes == 3 + 1 + 48 and len(t) == 1
    t.put(b"", b"")
    assert t.used_bytes == (3 + 1 + 48) + 48 and len(t) == 2
    assert t.get(b"") == b""                  # empty value is a hit, not None
    assert t.delete(b"abc") and t.used_bytes == 48
    assert not t.delete(b"abc")
    t.clear()
    assert t.used_bytes == 0 and len(t) == 0


def test_lru_order_moves():
    t = Table(10_000, 0)
    for k in (b"a", b"b", b"c", b"d"):
        t.put(k, b"v")
    assert t.keys() == [b"a", b"b", b"c", b"d"]
    t.get(b"a")                                # hit: MRU
    assert t.keys() == [b"b", b"c", b"d", b"a"]
    t.get_with_deadline(b"b")
    assert t.keys() == [b"c", b"d", b"a", b"b"]
    t.contains(b"c")                           # no move
    t.deadline(b"c")                           # no move
    t.set_deadline(b"c", FUTURE)               # no move
    assert t.keys() == [b"c", b"d", b"a", b"b"]
    t.put(b"c", b"w")                          # replacing: MRU
    assert t.keys() == [b"d", b"a", b"b", b"c"]
    t.get(b"zz")                               # miss: nothing moves
    assert t.keys() == [b"d", b"a", b"b", b"c"]
    assert (t.hits, t.misses) == (2, 1)


def test_eviction_order_counters_and_dirty():
    t = Table(30, 0)                           # room for three 10-byte entries
    for k in (b"k1", b"k2", b"k3"):
        t.put(k, b"v" * 8)
    t.clear_dirty()
    t.get(b"k1")                               # k2 is now LRU
    t.put(b"k4", b"v" * 8)
    assert t.keys() == [b"k3", b"k1", b"k4"]
    assert t.evicted == 1 and set(t.dirty) == {b"k2", b"k4"}
    assert t.used_bytes == 30
    t.max_bytes = 10
    assert t.evict() == 2 and t.keys() == [b"k4"] and t.evicted == 3
    assert t.evict() == 0
    t.max_bytes = 0
    assert t.evict() == 1 and len(t) == 0 and t.used_bytes == 0
    assert set(t.dirty) == {b"k1", b"k2", b"k3", b"k4"}


def test_lowering_max_bytes_alone_does_not_evict_but_next_put_does():
    t = Table(100, 0)
    for k in (b"a", b"b", b"c"):
        t.put(k, b"x" * 9)
    t.max_bytes = 20
    assert len(t) == 3 and t.evicted == 0
    t.put(b"d", b"x" * 9)                      # 40 bytes used -> evict a, b
    assert t.keys() == [b"c", b"d"] and t.evicted == 2 and t.used_bytes == 20


def test_put_evicts_while_over_budget_even_the_new_entry():
    """put() does not check the entry fits; the spec's eviction loop runs while
    used_bytes > max_bytes, so an entry bigger than the whole budget goes too."""
    t = Table(10, 0)
    t.put(b"a", b"1")
    t.put(b"big", b"x" * 20)
    assert len(t) == 0 and t.used_bytes == 0 and t.evicted == 2
    assert set(t.dirty) == {b"a", b"big"}


def test_deadlines_and_lazy_expiry():
    t = Table(10_000, 0)
    t.put(b"live", b"1", FUTURE)
    t.put(b"dead", b"2", PAST)                  # put does not check the deadline
    t.put(b"plain", b"3")
    assert len(t) == 3 and t.ttl_count == 2
    assert sorted(t.ttl_items()) == [(PAST, b"dead"), (FUTURE, b"live")]
    assert t.deadline(b"dead") == PAST          # no side effects, even when expired
    assert t.deadline(b"plain") is None and t.deadline(b"nope") is None
    assert len(t) == 3 and t.expired == 0
    t.clear_dirty()
    assert t.get_with_deadline(b"live") == (b"1", FUTURE)
    assert t.get_with_deadline(b"plain") == (b"3", None)
    assert t.get(b"dead") is None
    assert (t.hits, t.misses, t.expired, len(t), t.ttl_count) == (2, 1, 1, 2, 1)
    assert set(t.dirty) == {b"dead"}
    assert t.used_bytes == len(b"live") + 1 + len(b"plain") + 1


def test_contains_lazily_expires_without_counting():
    t = Table(10_000, 0)
    t.put(b"a", b"1", PAST)
    t.put(b"b", b"2")
    t.clear_dirty()
    assert t.contains(b"b") is True
    assert t.contains(b"a") is False
    assert t.contains(b"zz") is False
    assert (t.hits, t.misses, t.expired, len(t)) == (0, 0, 1, 1)
    assert set(t.dirty) == {b"a"}


def test_get_with_deadline_on_expired_and_absent():
    t = Table(10_000, 0)
    t.put(b"a", b"1", PAST)
    assert t.get_with_deadline(b"a") is None
    assert t.get_with_deadline(b"a") is None
    assert (t.hits, t.misses, t.expired) == (0, 2, 1)


def test_set_deadline():
    t = Table(10_000, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"2")
    t.clear_dirty()
    assert t.set_deadline(b"a", FUTURE) is True
    assert t.deadline(b"a") == FUTURE and t.ttl_count == 1
    assert set(t.dirty) == {b"a"} and t.keys() == [b"a", b"b"]
    assert t.set_deadline(b"a", None) is True
    assert t.deadline(b"a") is None and t.ttl_count == 0
    assert t.set_deadline(b"zz", FUTURE) is False
    assert set(t.dirty) == {b"a"}
    assert t.set_deadline(b"b", PAST) is True
    assert t.get(b"b") is None and t.expired == 1


def test_put_without_deadline_clears_ttl():
    t = Table(10_000, 0)
    t.put(b"a", b"1", FUTURE)
    t.put(b"a", b"2")
    assert t.deadline(b"a") is None and t.ttl_count == 0 and t.ttl_items() == []
    t.put(b"a", b"3", FUTURE + 5)
    t.put(b"a", b"4", FUTURE + 6)
    assert t.ttl_items() == [(FUTURE + 6, b"a")] and t.ttl_count == 1


def test_delete_and_expire():
    t = Table(10_000, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"2", FUTURE)
    t.clear_dirty()
    assert t.expire(b"b") is True
    assert t.expired == 1 and t.ttl_count == 0 and len(t) == 1
    assert t.expire(b"b") is False and t.expired == 1
    assert t.delete(b"a") is True and t.expired == 1
    assert t.delete(b"a") is False
    assert set(t.dirty) == {b"a", b"b"} and t.used_bytes == 0


def test_clear_keeps_counters_and_empties_dirty():
    t = Table(20, 0)
    t.put(b"a", b"1" * 9)
    t.put(b"b", b"1" * 9)
    t.put(b"c", b"1" * 9)                       # evicts a
    t.get(b"b")
    t.get(b"a")
    t.put(b"d", b"1", PAST)                     # evicts c
    t.get(b"d")
    before = (t.hits, t.misses, t.evicted, t.expired)
    assert before == (1, 2, 2, 1)
    t.clear()
    assert (t.hits, t.misses, t.evicted, t.expired) == before
    assert t.dirty == [] and len(t) == 0 and t.used_bytes == 0 and t.ttl_count == 0
    assert t.keys() == [] and t.ttl_items() == []
    t.put(b"a", b"x")                           # still usable
    assert t.get(b"a") == b"x"


def test_encode_records():
    t = Table(10_000, 0)
    t.put(b"k", b"value\r\n", FUTURE)
    t.put(b"", b"")
    t.put(b"old", b"v", PAST)
    got = t.encode([b"k", b"missing", b"", b"k", b"old"])
    want = (RECORD.pack(1, 7, FUTURE) + b"k" + b"value\r\n"
            + RECORD.pack(7, -1, 0) + b"missing"
            + RECORD.pack(0, 0, 0)
            + RECORD.pack(1, 7, FUTURE) + b"k" + b"value\r\n"
            + RECORD.pack(3, 1, PAST) + b"old" + b"v")
    assert got == want
    assert t.encode([]) == b"" and t.encode(()) == b""
    assert t.encode(k for k in [b"k"]) == RECORD.pack(1, 7, FUTURE) + b"k" + b"value\r\n"
    # encode has no side effects, even on an expired entry
    assert (t.hits, t.misses, t.expired, len(t)) == (0, 0, 0, 3)


# --------------------------------------------------------------------------- run()

GET_A = multibulk(b"GET", b"a")
SET_A = multibulk(b"SET", b"a", b"1")


def run(t, data, resp=2, out_cap=1 << 16, max_bulk=1 << 20):
    return t.run(data, resp, out_cap, max_bulk)


def test_run_empty_and_basic():
    t = Table(10_000, 0)
    assert run(t, b"") == (b"", 0, 0, None)
    data = SET_A + GET_A + multibulk(b"GET", b"b")
    assert run(t, data) == (b"+OK\r\n$1\r\n1\r\n$-1\r\n", len(data), 3, b"get")
    assert run(t, data, resp=3) == (b"+OK\r\n$1\r\n1\r\n_\r\n", len(data), 3, b"get")
    assert (t.hits, t.misses) == (2, 2)
    assert t.keys() == [b"a"]


def test_run_last_is_lowercase_name_of_last_command():
    t = Table(10_000, 0)
    assert run(t, multibulk(b"gEt", b"a"))[3] == b"get"
    assert run(t, multibulk(b"Set", b"a", b"b"))[3] == b"set"
    assert run(t, GET_A + multibulk(b"sET", b"a", b"c"))[3] == b"set"
    assert run(t, multibulk(b"set", b"a", b"c") + GET_A)[3] == b"get"
    assert run(t, multibulk(b"DEL", b"a"))[3] is None


@pytest.mark.parametrize("name", [b"GET", b"get", b"Get", b"gET", b"geT"])
def test_run_get_name_any_case(name):
    t = Table(10_000, 0)
    t.put(b"k", b"v")
    assert run(t, multibulk(name, b"k")) == (b"$1\r\nv\r\n", len(multibulk(name, b"k")), 1, b"get")


@pytest.mark.parametrize("name", [b"SET", b"set", b"sEt", b"SeT"])
def test_run_set_name_any_case(name):
    t = Table(10_000, 0)
    data = multibulk(name, b"k", b"v")
    assert run(t, data) == (b"+OK\r\n", len(data), 1, b"set")
    assert t.get(b"k") == b"v" and set(t.dirty) == {b"k"}


def test_run_binary_values_and_empty():
    t = Table(10_000, 0)
    data = multibulk(b"SET", b"\r\n", b"a\r\n$3\r\n*1\r\n") + multibulk(b"GET", b"\r\n") \
        + multibulk(b"SET", b"", b"") + multibulk(b"GET", b"")
    assert run(t, data) == (b"+OK\r\n$11\r\na\r\n$3\r\n*1\r\n\r\n+OK\r\n$0\r\n\r\n", len(data), 4, b"get")
    assert t.get(b"\r\n") == b"a\r\n$3\r\n*1\r\n"


@pytest.mark.parametrize("stopper", [
    pytest.param(b"PING hello\r\n", id="inline"),
    pytest.param(b"GET a\r\n", id="inline-get"),
    pytest.param(multibulk(b"DEL", b"a"), id="del"),
    pytest.param(multibulk(b"GET", b"a", b"b"), id="get-3-items"),
    pytest.param(multibulk(b"GET"), id="get-1-item"),
    pytest.param(multibulk(b"SET", b"a"), id="set-2-items"),
    pytest.param(multibulk(b"SET", b"a", b"b", b"NX"), id="set-4-items"),
    pytest.param(multibulk(b"GETS", b"a"), id="gets"),
    pytest.param(multibulk(b"GE", b"a"), id="ge"),
    pytest.param(b"*2\r\n$03\r\nGET\r\n$1\r\na\r\n", id="leading-zero-bulk"),
    pytest.param(b"*2\r\n$3\r\nGET\r\n$01\r\na\r\n", id="leading-zero-key"),
    pytest.param(b"*02\r\n$3\r\nGET\r\n$1\r\na\r\n", id="leading-zero-multibulk"),
    pytest.param(b"*+2\r\n$3\r\nGET\r\n$1\r\na\r\n", id="plus-multibulk"),
    pytest.param(b"*2\r\n$+3\r\nGET\r\n$1\r\na\r\n", id="plus-bulk"),
    pytest.param(b"*2\r\n$ 3\r\nGET\r\n$1\r\na\r\n", id="space-bulk"),
    pytest.param(b"*2\r\n$3 \r\nGET\r\n$1\r\na\r\n", id="trailing-space-bulk"),
    pytest.param(b"*2\r\n$\r\nGET\r\n$1\r\na\r\n", id="empty-bulk-length"),
    pytest.param(b"*\r\n$3\r\nGET\r\n$1\r\na\r\n", id="empty-multibulk-length"),
    pytest.param(b"*2\r\n$-1\r\n$1\r\na\r\n", id="null-bulk"),
    pytest.param(b"*2\r\n$3\r\nGET\r\n$-1\r\n", id="null-key"),
    pytest.param(b"*2\n$3\r\nGET\r\n$1\r\na\r\n", id="lf-multibulk"),
    pytest.param(b"*2\r\n$3\nGET\r\n$1\r\na\r\n", id="lf-bulk"),
    pytest.param(b"*2\r\n$3\r\nGETxx$1\r\na\r\n", id="bulk-no-crlf"),
    pytest.param(b"*2\r\n$3\r\nGET\r\n$1\r\nab\r\n", id="bulk-longer-than-length"),
    pytest.param(b"*2\r\n$3\r\nGET\r\n:1\r\n", id="integer-item"),
    pytest.param(b"*2\r\n+GET\r\n$1\r\na\r\n", id="simple-string-item"),
    pytest.param(b"*0\r\n", id="empty-multibulk"),
    pytest.param(b"*-1\r\n", id="null-multibulk"),
    pytest.param(b"*2\r\n$99999999999999999999999\r\nGET\r\n", id="huge-length"),
    pytest.param(b"*99999999999999999999999\r\n", id="huge-count"),
    pytest.param(b"\r\n", id="bare-crlf"),
    pytest.param(b"$3\r\nGET\r\n", id="bulk-not-multibulk"),
])
def test_run_stops_at(stopper):
    t = Table(10_000, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"2")
    data = GET_A + SET_A + stopper + GET_A
    reply, consumed, count, last = run(t, data)
    assert (reply, consumed, count, last) == (b"$1\r\n1\r\n+OK\r\n", len(GET_A + SET_A), 2, b"set")
    assert t.get(b"b") == b"2" and len(t) == 2          # nothing in the stopper applied
    # and at the very start: nothing at all
    assert run(t, stopper + GET_A) == (b"", 0, 0, None)


@pytest.mark.parametrize("cut", range(1, len(multibulk(b"SET", b"key", b"value"))))
def test_run_incomplete_trailing_command(cut):
    t = Table(10_000, 0)
    full = multibulk(b"SET", b"key", b"value")
    data = GET_A + full[:cut]
    assert run(t, data) == (b"$-1\r\n", len(GET_A), 1, b"get")
    assert len(t) == 0 and t.dirty == []


def test_run_max_bulk_boundary():
    t = Table(10_000, 0)
    at = multibulk(b"SET", b"k", b"v" * 10)
    over = multibulk(b"SET", b"j", b"v" * 11)
    assert run(t, at + over + GET_A, max_bulk=10) == (b"+OK\r\n", len(at), 1, b"set")
    assert t.get(b"k") == b"v" * 10 and t.get(b"j") is None
    # a key over max_bulk stops too, for GET and SET
    assert run(t, multibulk(b"GET", b"k" * 11), max_bulk=10) == (b"", 0, 0, None)
    assert run(t, multibulk(b"SET", b"k" * 11, b"v"), max_bulk=10) == (b"", 0, 0, None)
    # an incomplete command whose announced bulk is over max_bulk: stops at its start too
    assert run(t, GET_A + b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000\r\nxx", max_bulk=10)[1:] == (len(GET_A), 1, b"get")


def test_run_set_over_budget_is_not_applied():
    t = Table(100, 10)
    t.put(b"a", b"1")
    t.clear_dirty()
    exactly = multibulk(b"SET", b"k", b"v" * 89)          # 1 + 89 + 10 == 100: fits
    over = multibulk(b"SET", b"k", b"v" * 90)             # 101 > 100
    assert run(t, over + GET_A) == (b"", 0, 0, None)
    assert t.keys() == [b"a"] and t.dirty == [] and t.evicted == 0 and t.used_bytes == 12
    assert run(t, exactly + over) == (b"+OK\r\n", len(exactly), 1, b"set")
    assert t.keys() == [b"k"] and t.evicted == 1 and t.used_bytes == 100
    assert set(t.dirty) == {b"a", b"k"}
    # max_bytes is read at run time
    t.max_bytes = 99
    assert run(t, exactly) == (b"", 0, 0, None)
    assert t.get(b"k") == b"v" * 89


def test_run_set_evicts():
    t = Table(30, 0)
    for k in (b"a", b"b", b"c"):
        t.put(k, b"x" * 9)
    data = multibulk(b"SET", b"d", b"y" * 9) + multibulk(b"GET", b"a")
    assert run(t, data) == (b"+OK\r\n$-1\r\n", len(data), 2, b"get")
    assert t.keys() == [b"b", b"c", b"d"] and t.evicted == 1


def test_run_set_clears_deadline():
    t = Table(10_000, 0)
    t.put(b"a", b"0", FUTURE)
    run(t, SET_A)
    assert t.deadline(b"a") is None and t.ttl_count == 0


def test_run_get_expires_lazily():
    t = Table(10_000, 0)
    t.put(b"a", b"1", PAST)
    t.clear_dirty()
    assert run(t, GET_A, resp=3) == (b"_\r\n", len(GET_A), 1, b"get")
    assert (t.misses, t.expired, len(t)) == (1, 1, 0) and set(t.dirty) == {b"a"}


def test_run_get_moves_to_mru():
    t = Table(10_000, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"2")
    run(t, GET_A)
    assert t.keys() == [b"b", b"a"]


def test_run_out_cap():
    t = Table(10_000, 0)
    t.put(b"a", b"0123456789")                     # GET reply: $10\r\n0123456789\r\n = 17 bytes
    one = b"$10\r\n0123456789\r\n"
    data = GET_A * 3
    step = len(GET_A)
    assert run(t, data, out_cap=0) == (one, step, 1, b"get")       # always runs one command
    assert run(t, data, out_cap=16) == (one, step, 1, b"get")      # 17 > 16: stop after it
    assert run(t, data, out_cap=17) == (one * 2, 2 * step, 2, b"get")   # 17 does not exceed 17
    assert run(t, data, out_cap=33) == (one * 2, 2 * step, 2, b"get")
    assert run(t, data, out_cap=34) == (one * 3, 3 * step, 3, b"get")
    # SET replies count too
    sets = SET_A * 4
    assert run(t, sets, out_cap=9) == (b"+OK\r\n" * 2, 2 * len(SET_A), 2, b"set")


def test_run_out_cap_and_stoppers_together():
    t = Table(10_000, 0)
    data = SET_A + b"PING x\r\n"
    assert run(t, data, out_cap=0) == (b"+OK\r\n", len(SET_A), 1, b"set")
    data = SET_A + SET_A[:-1]
    assert run(t, data, out_cap=100) == (b"+OK\r\n", len(SET_A), 1, b"set")


def test_run_resp2_vs_resp3_null():
    t = Table(10_000, 0)
    assert run(t, GET_A, resp=2)[0] == b"$-1\r\n"
    assert run(t, GET_A, resp=3)[0] == b"_\r\n"
    t.put(b"a", b"")
    assert run(t, GET_A, resp=3)[0] == b"$0\r\n\r\n"
    assert run(t, GET_A, resp=2)[0] == b"$0\r\n\r\n"


def test_run_long_pipeline_matches_model():
    t = Table(5_000, 16)
    m = Model(5_000, 16)
    parts = []
    for i in range(3000):
        key = b"k%d" % (i * 7 % 150)
        if i % 3:
            parts.append(multibulk(b"SET", key, b"v%d" % i * (i % 5)))
        else:
            parts.append(multibulk(b"get", key))
    data = b"".join(parts)
    got = t.run(data, 2, 1 << 30, 512)
    assert got == m.run(data, 2, 1 << 30, 512)
    assert got[2] == 3000 and got[1] == len(data)
    assert_same(t, m)


def test_run_and_methods_hash_keys_alike():
    """run() hashes keys straight from the buffer; put()/get() use the bytes objects."""
    t = Table(1 << 30, 0)
    keys = [bytes((i * 37 + j) % 256 for j in range(i % 97)) + b"%d" % i for i in range(3000)]
    keys.append(b"")
    for i, k in enumerate(keys[::2]):
        t.put(k, b"p%d" % i)
    data = b"".join(multibulk(b"SET", k, b"r") for k in keys[1::2])
    assert run(t, data)[1:3] == (len(data), len(keys[1::2]))
    assert all(t.get(k) == b"r" for k in keys[1::2])
    data = b"".join(multibulk(b"GET", k) for k in keys[::2])
    reply = run(t, data)[0]
    assert reply == b"".join(b"$%d\r\n%s\r\n" % (len(b"p%d" % i), b"p%d" % i) for i in range(len(keys[::2])))
    assert len(t) == len(keys) and t.misses == 0


def test_run_resumed_from_consumed_matches_one_pass():
    """A server loop: call run() again on what was not consumed, as long as it runs something."""
    parts = []
    for i in range(400):
        key = b"k%d" % (i % 37)
        parts.append(multibulk(b"SET", key, b"v" * (i % 23)) if i % 2 else multibulk(b"GET", key))
    data = b"".join(parts) + b"*3\r\n$3\r\nSET\r\n$1\r\na"          # incomplete tail
    whole = Table(2_000, 8)
    one = whole.run(data, 3, 1 << 30, 1 << 20)
    pieces = Table(2_000, 8)
    replies, pos, total = [], 0, 0
    while True:
        reply, consumed, count, _ = pieces.run(data[pos:], 3, 50, 1 << 20)
        if not count:
            break
        assert consumed > 0 and reply
        replies.append(reply)
        pos += consumed
        total += count
    assert (b"".join(replies), pos, total) == one[:3]
    assert pos == len(data) - len(b"*3\r\n$3\r\nSET\r\n$1\r\na")
    assert state(pieces) == state(whole)


def test_run_wrong_data_type():
    t = Table(100, 0)
    for bad in ("*2\r\n", None, 3):
        with pytest.raises(TypeError):
            t.run(bad, 2, 100, 100)


# --------------------------------------------------------------------------- growth and churn

@pytest.mark.timeout(60)
def test_large_table_growth_and_deletion():
    n = 200_000
    t = Table(1 << 40, 0)
    keys = [b"key-%d" % i for i in range(n)]
    for i, k in enumerate(keys):
        t.put(k, b"%d" % i)
    assert len(t) == n
    for k in keys[::2]:
        assert t.delete(k)
    assert len(t) == n // 2
    for i, k in enumerate(keys):
        if i % 2:
            assert t.get(k) == b"%d" % i
        else:
            assert t.get(k) is None
            assert not t.contains(k)
    assert t.hits == n // 2 and t.misses == n // 2
    assert t.used_bytes == sum(len(k) + len(b"%d" % i) for i, k in enumerate(keys) if i % 2)
    # reinsert the deleted half, replace the other half
    for i, k in enumerate(keys):
        t.put(k, b"x" if i % 2 else b"y")
    assert len(t) == n
    assert all(t.get(k) == (b"x" if i % 2 else b"y") for i, k in enumerate(keys))
    # LRU order after the loop above: gets in key order
    assert t.keys() == keys
    t.clear()
    assert len(t) == 0 and all(not t.contains(k) for k in keys[:1000])


@pytest.mark.timeout(60)
def test_churn_of_distinct_keys_keeps_lookups_finite():
    """Insert and delete many distinct keys with a small live set: deleted slots must not
    fill the table so that lookups of absent keys never end."""
    t = Table(1 << 40, 0)
    live = []
    for i in range(200_000):
        k = b"c%d" % i
        t.put(k, b"v")
        live.append(k)
        if len(live) > 50:
            assert t.delete(live.pop(0))
    assert len(t) == 50 and t.keys() == live
    for i in range(1000):
        assert t.get(b"absent-%d" % i) is None
    assert all(t.get(k) == b"v" for k in live)


@pytest.mark.timeout(60)
def test_eviction_at_scale():
    t = Table(10_000 * 20, 10)                  # each entry: 5-byte key + 5-byte value + 10
    for i in range(100_000):
        t.put(b"%05d" % (i % 100_000), b"vvvvv")
    assert len(t) == 10_000 and t.used_bytes == 200_000
    assert t.evicted == 90_000
    assert t.keys() == [b"%05d" % i for i in range(90_000, 100_000)]
    assert t.get(b"%05d" % 89_999) is None and t.get(b"%05d" % 90_000) == b"vvvvv"


# --------------------------------------------------------------------------- references

def _fresh(n: int) -> bytes:
    return bytes(range(n % 256)) + b"#" * n       # not interned, not cached


def test_refcounts_return_after_put_and_delete():
    t = Table(1 << 20, 0)
    key, value = _fresh(30), _fresh(100)
    rk, rv = sys.getrefcount(key), sys.getrefcount(value)
    t.put(key, value, FUTURE)
    for _ in range(100):
        t.get(key)
        t.get_with_deadline(key)
        t.contains(key)
        t.deadline(key)
        t.keys()
        t.ttl_items()
        t.encode([key])
        t.run(multibulk(b"GET", key), 2, 1 << 16, 1 << 20)
        t.dirty
    assert t.delete(key)
    t.clear_dirty()
    assert (sys.getrefcount(key), sys.getrefcount(value)) == (rk, rv)


def test_refcounts_return_after_replace_evict_expire_clear():
    t = Table(1 << 20, 0)
    objs = [_fresh(40 + i) for i in range(8)]
    k1, v1, v2, k2, v3, k3, v4, k4 = objs
    before = [sys.getrefcount(o) for o in objs]
    t.put(k1, v1)
    t.put(k1, v2)                           # replace
    t.put(k2, v3, PAST)
    t.get(k2)                               # lazy expiry
    t.put(k3, v4)
    t.expire(k3)
    t.put(k4, v1)
    t.max_bytes = 0
    t.evict()                               # eviction
    t.max_bytes = 1 << 20
    t.put(k1, v3)
    t.set_deadline(k1, FUTURE)
    t.clear()                               # clear
    t.clear_dirty()
    assert [sys.getrefcount(o) for o in objs] == before


def test_refcount_of_returned_value_is_not_leaked():
    t = Table(1 << 20, 0)
    value = _fresh(200)
    t.put(b"k", value)
    held = sys.getrefcount(value)
    for _ in range(1000):
        t.get(b"k")
        t.get_with_deadline(b"k")
    assert sys.getrefcount(value) == held


def test_refcount_of_put_none_deadline_and_dirty_list():
    t = Table(1 << 20, 0)
    rn = sys.getrefcount(None)
    for _ in range(200):
        t.put(b"k", b"v", None)
        t.set_deadline(b"k", None)
        t.deadline(b"k")
        t.get(b"nope")
        t.run(GET_A, 2, 100, 100)
        t.clear_dirty()
    assert abs(sys.getrefcount(None) - rn) < 50      # would be off by hundreds if leaking


# --------------------------------------------------------------------------- types

class Sub(bytes):
    pass


@pytest.mark.parametrize("bad", ["k", bytearray(b"k"), memoryview(b"k"), Sub(b"k"), None, 1])
def test_wrong_key_types(bad):
    t = Table(1000, 0)
    t.put(b"k", b"v")
    for call in (lambda: t.get(bad), lambda: t.get_with_deadline(bad), lambda: t.contains(bad),
                 lambda: t.deadline(bad), lambda: t.put(bad, b"v"), lambda: t.set_deadline(bad, None),
                 lambda: t.delete(bad), lambda: t.expire(bad), lambda: t.encode([bad]),
                 lambda: t.encode([b"k", bad])):
        with pytest.raises(TypeError):
            call()
    assert t.keys() == [b"k"] and t.used_bytes == 2 and (t.hits, t.misses) == (0, 0)


@pytest.mark.parametrize("bad", ["v", bytearray(b"v"), memoryview(b"v"), Sub(b"v"), None, 1])
def test_wrong_value_types(bad):
    t = Table(1000, 0)
    with pytest.raises(TypeError):
        t.put(b"k", bad)
    assert len(t) == 0 and t.used_bytes == 0 and t.dirty == []


@pytest.mark.parametrize("bad", ["1", b"1", 1.5])
def test_wrong_deadline_types(bad):
    t = Table(1000, 0)
    t.put(b"k", b"v")
    with pytest.raises(TypeError):
        t.put(b"j", b"v", bad)
    with pytest.raises(TypeError):
        t.set_deadline(b"k", bad)
    assert t.keys() == [b"k"] and t.deadline(b"k") is None


def test_encode_wants_an_iterable():
    t = Table(1000, 0)
    with pytest.raises(TypeError):
        t.encode(5)
    with pytest.raises(TypeError):
        t.encode(None)


# --------------------------------------------------------------------------- MGET and PING

def test_mget_answers_an_array_counting_each_key():
    t = Table(1 << 20, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"22")
    data = multibulk(b"MGET", b"a", b"zz", b"b") + multibulk(b"ping")
    for resp, null in ((2, b"$-1\r\n"), (3, b"_\r\n")):
        reply, consumed, count, last = t.run(data, resp, 1 << 20, 1 << 20)
        assert reply == b"*3\r\n$1\r\n1\r\n" + null + b"$2\r\n22\r\n+PONG\r\n"
        assert (consumed, count, last) == (len(data), 2, b"ping")
    assert (t.hits, t.misses) == (4, 2)
    assert t.keys() == [b"a", b"b"]  # each read counts as use, in order


def test_an_incomplete_mget_stops_before_reading_any_key():
    t = Table(1 << 20, 0)
    t.put(b"a", b"1")
    whole = multibulk(b"MGET", b"a", b"a", b"a")
    for cut in range(1, len(whole)):
        assert t.run(whole[:cut], 2, 1 << 20, 1 << 20) == (b"", 0, 0, None)
    assert (t.hits, t.misses) == (0, 0)


def test_max_items_stops_a_longer_command():
    t = Table(1 << 20, 0)
    data = multibulk(b"MGET", b"a", b"b", b"c")
    assert t.run(data, 2, 1 << 20, 1 << 20, 4)[2] == 1
    assert t.run(data, 2, 1 << 20, 1 << 20, 3)[:3] == (b"", 0, 0)
    with pytest.raises(ValueError):
        t.run(data, 2, 1 << 20, 1 << 20, 0)


def test_idle_counts_seconds_since_a_read_or_write_not_since_a_peek():
    t = Table(1 << 20, 0)
    t.put(b"a", b"1")
    t.put(b"b", b"1")
    assert t.idle(b"a") == 0 and t.idle(b"missing") is None
    time.sleep(1.2)
    t.peek_with_deadline(b"a")
    t.encoding(b"a")
    assert t.idle(b"a") >= 1 and t.idle(b"b") >= 1
    t.get(b"a")                                   # a read
    t.run(b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n", 2, 1 << 16, 1 << 20)  # a write on the plain path
    assert t.idle(b"a") == 0 and t.idle(b"b") == 0
    t.put(b"c", b"1", PAST)
    assert t.idle(b"c") is None
    with pytest.raises(TypeError):
        t.idle("a")
