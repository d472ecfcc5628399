"""The same command sequences against a real redis-server and against ARCA: byte-identical replies.

redis-server runs on a free 127.0.0.1 port configured as ARCA is (one database, an LRU
policy under a maxmemory, proto-max-bulk-len 64 MiB, no persistence). Each script starts
from FLUSHALL; every reply is compared as raw RESP bytes, in RESP2 and again in RESP3.
Replies that legitimately differ (sizes, times, help texts) are checked elsewhere.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from differential_scripts import SCRIPTS, random_transactions

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server not installed (apt-get install redis-server)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RawClient:
    """Sends commands as RESP arrays and reads each reply back as its raw bytes."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.file = self.sock.makefile("rb")

    def call(self, *argv: bytes | str) -> bytes:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts))
        return self._read()

    def _read(self) -> bytes:
        line = self.file.readline()
        if not line:
            raise ConnectionError("connection closed")
        kind = line[:1]
        if kind in b"$=!":
            size = int(line[1:-2])
            return line if size < 0 else line + self.file.read(size + 2)
        if kind in b"*~>%|":
            size = int(line[1:-2])
            items = size * 2 if kind in b"%|" else max(size, 0)
            raw = line + b"".join(self._read() for _ in range(items))
            return raw + self._read() if kind == b"|" else raw  # an attribute precedes its reply
        return line

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    directory = tmp_path_factory.mktemp("redis")
    port = _free_port()
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--databases", "1", "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru",
         "--proto-max-bulk-len", "64mb", "--dir", str(directory), "--protected-mode", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            client = RawClient("127.0.0.1", port)
            if client.call("PING") == b"+PONG\r\n":
                client.close()
                break
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            # .ci/run installs redis-server: one that cannot start is a broken run, not a reason to skip
            pytest.fail(f"redis-server did not answer PING on 127.0.0.1:{port} (exit code {process.poll()})")
        time.sleep(0.05)
    yield port
    process.terminate()
    process.wait(10)


def _same_idle_time(argv: tuple, mine: bytes, real: bytes) -> bool:
    """OBJECT IDLETIME counts whole seconds of each server's own clock (Redis's LRU clock, ARCA's
    monotonic one), so a script that runs across a second boundary of one clock and not the
    other's reads 0 from one and 1 from the other: integer replies a second apart agree."""
    if [part.upper() for part in argv[:2]] != ["OBJECT", "IDLETIME"]:
        return False
    if not (mine.startswith(b":") and real.startswith(b":")):
        return False
    return abs(int(mine[1:-2]) - int(real[1:-2])) <= 1


def _differences(arca, redis_port: int, resp: int) -> list[str]:
    ours, theirs = RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)
    differences = []
    try:
        if resp == 3:
            ours.call("HELLO", "3")
            theirs.call("HELLO", "3")
        for name, script in SCRIPTS.items():
            for client in (ours, theirs):
                client.call("FLUSHALL")
            for argv in script:
                mine, real = ours.call(*argv), theirs.call(*argv)
                if mine != real and not _same_idle_time(argv, mine, real):
                    differences.append(f"[{name}] RESP{resp} {argv!r}:\n   redis {real!r}\n   arca  {mine!r}")
    finally:
        ours.close()
        theirs.close()
    return differences


@pytest.mark.timeout(120)
@pytest.mark.parametrize("resp", [2, 3])
def test_replies_match_redis(arca, redis_port, resp):
    differences = _differences(arca, redis_port, resp)
    assert not differences, f"{len(differences)} replies differ:\n" + "\n".join(differences[:40])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("resp", [2, 3])
def test_watch_and_transactions_on_two_connections_match_redis(arca, redis_port, resp):
    ours = [RawClient(arca.host, arca.port) for _ in range(2)]
    theirs = [RawClient("127.0.0.1", redis_port) for _ in range(2)]
    differences = []
    try:
        for seed in range(8):
            for client in (*ours, *theirs):
                client.call("RESET")
                client.call("HELLO", str(resp))
            ours[0].call("FLUSHALL")
            theirs[0].call("FLUSHALL")
            for which, argv in random_transactions(seed, 400):
                mine, real = ours[which].call(*argv), theirs[which].call(*argv)
                if mine != real:
                    differences.append(f"[seed {seed}] connection {which} {argv!r}:\n   redis {real!r}\n   arca  {mine!r}")
    finally:
        for client in (*ours, *theirs):
            client.close()
    assert not differences, f"{len(differences)} replies differ:\n" + "\n".join(differences[:40])


_COUNTED = [line.split() for line in (
    "OBJECT ENCODING a;OBJECT ENCODING nokey;MEMORY USAGE a;TOUCH a;EXPIRETIME a;PEXPIRETIME nokey;COPY a b;"
    "LCS a b;GETRANGE a 0 1;SETRANGE a 0 x;SETBIT a 1 1;GETBIT a 1;BITCOUNT a;BITPOS a 1;GETEX a;GETSET a 2;"
    "INCRBYFLOAT a 1;RENAME a c;MSETNX x 1;EXPIRE c 100;PERSIST c;PERSIST nokey;EXPIRE nokey 5;TTL c;"
    "RENAMENX c d;COPY d e REPLACE;GETEX d PERSIST;SUBSTR nokey 0 1;SETRANGE nokey 1 x;SETBIT nokey2 1 1"
).split(";")]


@pytest.mark.timeout(60)
def test_keyspace_hits_and_misses_count_as_redis_counts(arca, redis_port):
    """Reads count as keyspace hits or misses; the lookups of writes (SETRANGE, EXPIRE, ...) do not."""
    counters = []
    for client in (RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)):
        client.call("FLUSHALL")
        client.call("SET", "a", "1")
        client.call("CONFIG", "RESETSTAT")
        seen = []
        for argv in _COUNTED:
            client.call(*argv)
            stats = client.call("INFO", "stats").decode().split("\r\n")
            seen.append((argv, [line for line in stats if line.startswith(("keyspace_hits:", "keyspace_misses:"))]))
        counters.append(seen)
        client.close()
    assert counters[0] == counters[1]


@pytest.mark.timeout(60)
def test_info_cpu_and_slowlog_shapes_match_redis(arca, redis_port):
    ours, theirs = RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)
    try:
        fields = []
        for client in (ours, theirs):
            body = client.call("INFO", "cpu").split(b"\r\n", 1)[1].decode()
            fields.append([line.split(":")[0] for line in body.split("\r\n") if line])
        assert fields[0] == fields[1]
        for client in (ours, theirs):
            client.call("SLOWLOG", "RESET")
            client.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
            client.call("SET", "k", "v" * 300)
        for client in (ours, theirs):
            entry = client.call("SLOWLOG", "GET", "1")
            client.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
            assert entry.startswith(b"*1\r\n*6\r\n:")
            cut = b"v" * 128 + b"... (172 more bytes)"
            assert b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%b\r\n" % (len(cut), cut) in entry
    finally:
        ours.close()
        theirs.close()


def _bulk_text(raw: bytes) -> str:
    """The text of a bulk string reply ($n or RESP3 verbatim =n with its 'txt:' prefix)."""
    body = raw.split(b"\r\n", 1)[1][:-2]
    return (body[4:] if raw.startswith(b"=") else body).decode()


def _sections(client: RawClient, *args: str) -> list[str]:
    return [line for line in _bulk_text(client.call("INFO", *args)).split("\r\n") if line.startswith("# ")]


@pytest.mark.timeout(60)
def test_info_sections_asked_for_match_redis(arca, redis_port):
    """INFO with no, one, several and unknown sections: the sections Redis answers, less
    those ARCA has no counterpart for (Modules, Latencystats), plus ARCA's own."""
    ours, theirs = RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)
    try:
        for args in [(), ("default",), ("all",), ("everything",), ("cpu",), ("CPU",), ("commandSTATS",),
                     ("cpu", "replication"), ("cpu", "default"), ("cpu", "all"), ("keyspace", "cpu"),
                     ("errorstats",), ("replication",), ("nosuch",), ("cpu", "nosuch"), ("server", "server")]:
            mine = [s for s in _sections(ours, *args) if s != "# Arca"]
            real = [s for s in _sections(theirs, *args) if s not in ("# Modules", "# Latencystats")]
            assert mine == real, args
        replication = _bulk_text(ours.call("INFO", "replication"))
        assert "role:master\r\n" in replication and "connected_slaves:0\r\n" in replication
        assert ours.call("INFO", "nosuch") == theirs.call("INFO", "nosuch") == b"$0\r\n\r\n"
    finally:
        ours.close()
        theirs.close()


def _stats(client: RawClient, section: str) -> dict[str, dict[str, str]]:
    """INFO commandstats or errorstats as {name: {field: value}}, times left out."""
    found = {}
    for line in _bulk_text(client.call("INFO", section)).split("\r\n"):
        if ":" in line:
            name, fields = line.split(":", 1)
            found[name] = {k: v for k, v in (f.split("=") for f in fields.split(",")) if not k.startswith("usec")}
    return found


@pytest.mark.timeout(60)
def test_commandstats_and_errorstats_count_as_redis_counts(arca, redis_port):
    """Calls, rejected calls (refused before running: arity, inside MULTI) and failed calls
    (an error while running) per command, plain-path commands included, and errors by prefix."""
    script = [("SET", "foo", "bar"), ("GET", "foo"), ("GET", "nokey"), ("MGET", "foo", "x"), ("INCR", "n"),
              ("INCRBY", "n", "2"), ("DECR", "n"), ("DECRBY", "n", "3"), ("MSET", "a", "1", "b", "2"), ("PING",),
              ("EXPIRE", "foo", "0"), ("GET",), ("INCR", "a", "b"), ("INCR", "bar"), ("SET", "bar", "x"),
              ("INCR", "bar"), ("APPEND", "bar", "y"), ("SETRANGE", "bar", "-1", "x"), ("NOSUCH", "x"),
              ("MULTI",), ("SET", "k", "v"), ("GET",), ("EXEC",), ("OBJECT", "ENCODING", "a"),
              ("OBJECT", "NOPE"), ("CONFIG", "GET", "maxclients")]
    seen = []
    for client in (RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)):
        try:
            client.call("FLUSHALL")
            client.call("CONFIG", "RESETSTAT")
            for argv in script:
                client.call(*argv)
            seen.append((_stats(client, "commandstats"), _stats(client, "errorstats")))
        finally:
            client.close()
    (our_commands, our_errors), (their_commands, their_errors) = seen
    assert our_commands == their_commands
    assert our_errors == their_errors
    assert our_commands["cmdstat_expire"] == {"calls": "1", "rejected_calls": "0", "failed_calls": "0"}


@pytest.mark.timeout(60)
def test_command_list_categories_and_patterns_agree_with_redis(arca, redis_port):
    """Every ARCA command (that Redis 7.0 has) listed under an ACL category or a pattern is
    listed there by Redis too, and the other way round for the commands ARCA has."""
    ours, theirs = RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)

    def names(client: RawClient, *args: str) -> set[bytes]:
        raw = client.call("COMMAND", "LIST", *args)
        return {line for line in raw.split(b"\r\n")[2::2]} - {b""}

    try:
        mine_all, real_all = names(ours), names(theirs)
        shared = mine_all & real_all
        assert {b"get", b"set", b"client|list", b"config|get", b"object|encoding"} <= shared
        for category in ("read", "write", "string", "bitmap", "keyspace", "fast", "slow", "admin", "dangerous",
                         "connection", "transaction"):
            mine = names(ours, "FILTERBY", "ACLCAT", category) & shared
            real = names(theirs, "FILTERBY", "ACLCAT", category) & shared
            assert mine == real, (category, mine ^ real)
        for pattern in ("config*", "config|*re*", "cl*list", "*get*", "?et"):
            mine = names(ours, "FILTERBY", "PATTERN", pattern)
            real = names(theirs, "FILTERBY", "PATTERN", pattern) & mine_all
            assert mine - {n for n in mine if n not in real_all} == real, pattern
    finally:
        ours.close()
        theirs.close()


@pytest.mark.timeout(60)
def test_oom_after_config_set_maxmemory_refuses_writes_as_redis_does(arca, redis_port):
    """CONFIG SET maxmemory below what any write needs: a write is -OOM, queued in MULTI too
    (DISCARD still works), an EXEC holding a write queued before is EXECABORT ... OOM, reads
    and PING go on; bad values are Redis's error; CONFIG GET reads the new budget back."""
    pairs = [(RawClient(arca.host, arca.port), RawClient(arca.host, arca.port)),
             (RawClient("127.0.0.1", redis_port), RawClient("127.0.0.1", redis_port))]
    replies = []
    try:
        for main, other in pairs:
            budget = other.call("CONFIG", "GET", "maxmemory").split(b"\r\n")[-2]
            seen = [other.call("CONFIG", "SET", "maxmemory", "bla"), other.call("CONFIG", "SET", "maxmemory", "3k"),
                    other.call("CONFIG", "GET", "maxmemory"), other.call("CONFIG", "SET", "maxmemory", "2mb"),
                    other.call("CONFIG", "GET", "maxmemory"), main.call("MULTI"), main.call("SET", "x", "1"),
                    main.call("GET", "x"), other.call("CONFIG", "SET", "maxmemory", "1"), main.call("EXEC"),
                    main.call("SET", "x", "1"), main.call("MULTI"), main.call("SET", "x", "1"), main.call("PING"),
                    main.call("DISCARD"), main.call("MULTI"), main.call("GET", "x"), main.call("PING"),
                    main.call("EXEC"), main.call("PING")]
            seen.append(other.call("CONFIG", "SET", "maxmemory", budget))
            seen.append(main.call("SET", "x", "1"))
            replies.append(seen)
    finally:
        for main, other in pairs:
            main.close()
            other.close()
    assert replies[0] == replies[1]
    assert replies[0][9].startswith(b"-EXECABORT Transaction discarded because of: OOM")


@pytest.mark.timeout(60)
def test_memory_usage_after_a_big_value_is_replaced(arca, redis_port):
    """Redis's "trim on SET with big value": after a 100,000-byte value is replaced by a
    33,000-byte one, the key costs less than 42,000 bytes (no buffer of the big one kept)."""
    for client in (RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)):
        try:
            client.call("SET", "key", "A" * 100000)
            client.call("SET", "key", "A" * 33000)
            usage = int(client.call("MEMORY", "USAGE", "key")[1:-2])
            assert 33000 < usage < 42000
        finally:
            client.close()


@pytest.mark.timeout(60)
def test_object_idletime_counts_uses_not_ttl_type_exists_as_redis_does(arca, redis_port):
    """Redis's "TTL, TYPE and EXISTS do not alter the last access time of a key" and "TOUCH
    alters the last access time of a key", on both servers at once."""
    clients = [RawClient(arca.host, arca.port), RawClient("127.0.0.1", redis_port)]
    try:
        for client in clients:
            client.call("SET", "foo", "bar")
            client.call("SET", "other", "x")
            assert client.call("OBJECT", "IDLETIME", "foo") == b":0\r\n"
        time.sleep(2.2)
        for client in clients:
            for argv in (("TTL", "foo"), ("PTTL", "foo"), ("TYPE", "foo"), ("EXISTS", "foo"),
                         ("OBJECT", "ENCODING", "foo"), ("EXPIRETIME", "foo")):
                client.call(*argv)
            assert int(client.call("OBJECT", "IDLETIME", "foo")[1:-2]) >= 2
            client.call("TOUCH", "foo")
            client.call("GET", "other")
            assert client.call("OBJECT", "IDLETIME", "foo") == b":0\r\n"
            assert client.call("OBJECT", "IDLETIME", "other") == b":0\r\n"
            assert client.call("OBJECT", "IDLETIME", "nokey") == b"$-1\r\n"
    finally:
        for client in clients:
            client.close()
