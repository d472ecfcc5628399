"""The fleet tier against the real archive: node B restores what node A prefilled, a damaged
archived state is refused, and a down ARCA only costs the speed-up."""

from __future__ import annotations


import pytest

from arca.launch import spawn_arca
from node.archive.client import EmbeddedArchive, RemoteArchive
from node.cache import blob
from node.cache.fleet import FleetConfig, FleetTier, archive_key, split_parts
from node.cache.keys import CacheIdentity
from node.cache.prefix_cache import PrefixCache, PrefixCacheConfig
from tests.conftest import free_port

from test_prefix_cache_hook import DOC, fake_state, run_prompt

IDENTITY = CacheIdentity(model_fingerprint="ab" * 32, runtime="test")


def make(directory, part_bytes: int | None = None) -> PrefixCache:
    return PrefixCache(IDENTITY, PrefixCacheConfig(directory=directory, block_tokens=8, checkpoint_tokens=16,
                                                   min_gain_tokens=0))


@pytest.fixture
async def archive(tmp_path):
    from arca.archive import ArchiveConfig

    client = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=10**7,
                                           corpus_max_bytes=10**7, kv_max_bytes=10**7))
    yield client
    await client.close()


async def test_node_b_restores_a_prefix_node_a_prefilled(tmp_path, archive):
    node_a, node_b = make(tmp_path / "a"), make(tmp_path / "b")
    fleet_a, fleet_b = FleetTier(node_a, archive), FleetTier(node_b, archive)
    try:
        run_prompt(node_a, DOC + [1])  # stores 16, 32 and 40
        assert node_a.flush()
        await fleet_a.drain()
        assert node_a.stats()["fleet_pushes"] == 3

        question = DOC + [5, 6, 7]
        assert node_b.lookup(question) is None
        assert await fleet_b.prefetch(question) == 40
        assert node_b.lookup(question) == (40, fake_state(question, 40))
        stats = node_b.stats()
        assert stats["fleet_hits"] == 1 and stats["ram_hits"] == 1
        assert node_b.flush() and node_b.disk.contains(node_b.chain.boundaries(DOC)[-1].key)
        assert await fleet_b.prefetch(question) == 0  # already local: no second fetch
        await fleet_b.drain()
        assert node_b.stats()["fleet_pushes"] == 0  # what it fetched is not pushed back
    finally:
        node_a.close()
        node_b.close()


async def test_a_damaged_archived_state_is_refused(tmp_path, archive):
    node = make(tmp_path / "n")
    fleet = FleetTier(node, archive, FleetConfig(push=False))
    try:
        boundary = node.chain.boundaries(DOC)[-1]
        data = blob.encode(boundary.key, 40, b"state")
        await archive.kv_put(archive_key(boundary.key), split_parts(data[:-1] + b"?", 1 << 20)[0])
        assert await fleet.prefetch(DOC + [1]) == 0
        assert node.lookup(DOC + [1]) is None
        assert node.stats()["fleet_errors"] == 1
    finally:
        node.close()


async def test_a_down_arca_only_costs_the_speed_up(tmp_path):
    remote = RemoteArchive("127.0.0.1", free_port(), timeout_ms=100)
    node = make(tmp_path / "n")
    fleet = FleetTier(node, remote)
    try:
        assert await fleet.prefetch(DOC + [1]) == 0
        run_prompt(node, DOC + [1])
        assert node.flush()
        await fleet.drain()
        assert node.lookup(DOC + [2])[0] == 40  # the local tiers still work
    finally:
        node.close()
        await remote.close()


async def test_states_split_in_parts_travel_through_a_real_arca(tmp_path):
    """Two nodes and a `reame arca` process over RESP; each state crosses as several parts."""
    proc, port = spawn_arca(tmp_path / "arca", capture=True)
    clients = [RemoteArchive("127.0.0.1", port, timeout_ms=2000) for _ in range(2)]
    node_a, node_b = make(tmp_path / "a"), make(tmp_path / "b")
    try:
        fleet_a = FleetTier(node_a, clients[0], FleetConfig(part_bytes=64))
        fleet_b = FleetTier(node_b, clients[1], FleetConfig(part_bytes=64))
        long_state = DOC + [1]
        hit = node_a.lookup(long_state)
        assert hit is None
        for n in node_a.boundaries_to_store(long_state):
            node_a.store(long_state, n, bytes(range(256)) * 3 + fake_state(long_state, n))
        assert node_a.flush()
        await fleet_a.drain()
        assert await fleet_b.prefetch(DOC + [9]) == 40
        n_tokens, state = node_b.lookup(DOC + [9])
        assert n_tokens == 40 and state.endswith(fake_state(long_state, 40)) and len(state) > 10 * 64
        # a part gone from the archive (evicted) makes the state a miss, never a wrong state
        node_c = make(tmp_path / "c")
        try:
            fleet_c = FleetTier(node_c, clients[1], FleetConfig(part_bytes=64, push=False))
            other = [7] * 17
            key = node_c.chain.boundaries(other)[0].key
            parts = split_parts(blob.encode(key, 16, b"s" * 300), 64)
            assert len(parts) > 3
            for index in range(len(parts) - 1):  # all but the last part
                await clients[1].kv_put(archive_key(key, index), parts[index])
            assert await fleet_c.prefetch(other) == 0
            assert node_c.lookup(other) is None and node_c.stats()["fleet_misses"] == 1
        finally:
            node_c.close()
    finally:
        node_a.close()
        node_b.close()
        for client in clients:
            await client.close()
        proc.terminate()
        proc.wait(timeout=10)


class BusyLink:
    """A loopback TCP proxy in front of a real ARCA that makes it behave like one on a busy
    host: each request (a burst of bytes after a pause) waits its turn across all connections
    and `per_request_s`, as a single-threaded server's requests do, and the reply that follows
    waits `per_kib_s` for each KiB the client sent (a write of a 1 MB part waiting for its
    commit). A fake of a loaded host, since the load itself cannot be made to order in a test."""

    def __init__(self, port: int, *, per_request_s: float = 0.0, per_kib_s: float = 0.0) -> None:
        self.port, self.per_request_s, self.per_kib_s = port, per_request_s, per_kib_s
        self.server = None
        self._turn = None

    async def start(self) -> int:
        import asyncio

        self._turn = asyncio.Lock()
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        import asyncio

        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        owed = [0.0]  # seconds the next reply waits

        async def requests() -> None:
            loop, last = asyncio.get_running_loop(), 0.0
            while data := await reader.read(1 << 16):
                if self.per_request_s and loop.time() - last > 0.01:  # a new request
                    async with self._turn:
                        await asyncio.sleep(self.per_request_s)
                last = loop.time()
                owed[0] += len(data) / 1024 * self.per_kib_s
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def replies() -> None:
            while data := await up_reader.read(1 << 16):
                if owed[0]:
                    wait, owed[0] = owed[0], 0.0
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(requests(), replies(), return_exceptions=True)

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def big_state(tokens, n) -> bytes:
    return fake_state(tokens, n) * 25  # up to ~3 kB: several parts of 1 KiB


@pytest.mark.parametrize("busy", ["serialized requests", "slow writes"])
async def test_states_cross_a_busy_arca(tmp_path, busy):
    """The answer-path timeout is 0.2 s. With every request waiting its turn and 0.06 s, the
    parts of a state fetched concurrently queued behind each other past that timeout: the
    fetch must still find the state. With a write's reply waiting 0.25 s a KiB, a push sending
    each part as its own command on the answer path failed and opened the breaker: the push
    must still arrive."""
    proc, port = spawn_arca(tmp_path / "arca", capture=True)
    link = BusyLink(port, **({"per_request_s": 0.06} if busy == "serialized requests" else {"per_kib_s": 0.25}))
    slow = await link.start()
    writer = RemoteArchive("127.0.0.1", slow, timeout_ms=200)
    reader = RemoteArchive("127.0.0.1", slow, timeout_ms=200)
    node_a, node_b = make(tmp_path / "a"), make(tmp_path / "b")
    try:
        await writer.start()
        await reader.start()
        fleet_a = FleetTier(node_a, writer, FleetConfig(part_bytes=1024))
        fleet_b = FleetTier(node_b, reader, FleetConfig(part_bytes=1024, push=False))
        prompt = DOC + [1]
        for n in node_a.boundaries_to_store(prompt):
            node_a.store(prompt, n, big_state(prompt, n))
        assert node_a.flush()
        await fleet_a.drain()
        stats = node_a.stats()
        assert (stats["fleet_pushes"], stats["fleet_errors"]) == (3, 0), stats
        assert await fleet_b.prefetch(DOC + [9]) == 40, node_b.stats()
        assert node_b.lookup(DOC + [9]) == (40, big_state(prompt, 40))
        assert node_b.stats()["fleet_bytes_fetched"] > 2 * 1024  # the state came in parts
        assert writer.state() == reader.state() == "ok"
    finally:
        node_a.close()
        node_b.close()
        await writer.close()
        await reader.close()
        await link.close()
        proc.terminate()
        proc.wait(timeout=10)


async def test_flush_pushes_a_state_still_being_written_when_the_node_stops(tmp_path, archive):
    """A node stopping right after an answer: the state's disk write is still running (made
    slow here, a stand-in for a busy disk) when shutdown begins. `flush` must hand it to the
    fleet and push it before `close`; closing alone dropped what the writer had not offered."""
    import threading
    import time

    node = make(tmp_path / "a")
    put, release = node.disk.put, threading.Event()

    def slow_put(*args):
        release.wait(5)
        return put(*args)

    node.disk.put = slow_put
    fleet = FleetTier(node, archive)
    try:
        prompt = DOC + [1]
        for n in node.boundaries_to_store(prompt):
            node.store(prompt, n, big_state(prompt, n))
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        assert await fleet.flush(5.0)
        assert time.monotonic() - started < 5.0
        await fleet.close()
        assert node.stats()["fleet_pushes"] == 3
        reader = make(tmp_path / "b")
        try:
            assert await FleetTier(reader, archive, FleetConfig(push=False)).prefetch(DOC + [9]) == 40
        finally:
            reader.close()
    finally:
        release.set()
        node.close()


async def test_a_second_node_keeps_the_tenants_apart(tmp_path, archive):
    """What node A stored for tenant "a" reaches node B through the archive under the tenant's
    own keys: B fetches it for "a", never for "b" or the open tenant."""
    node_a, node_b = make(tmp_path / "a"), make(tmp_path / "b")
    fleet_a, fleet_b = FleetTier(node_a, archive), FleetTier(node_b, archive)
    try:
        prompt = DOC + [1]
        for n in node_a.boundaries_to_store(prompt, "a"):
            node_a.store(prompt, n, fake_state(prompt, n), "a")
        assert node_a.flush()
        await fleet_a.drain()
        assert node_a.stats()["fleet_pushes"] == 3
        question = DOC + [5, 6, 7]
        assert await fleet_b.prefetch(question, "b") == 0 and await fleet_b.prefetch(question) == 0
        assert node_b.lookup(question, "b") is None and node_b.lookup(question) is None
        assert await fleet_b.prefetch(question, "a") == 40
        assert node_b.lookup(question, "a") == (40, fake_state(question, 40))
        assert node_b.lookup(question, "b") is None
    finally:
        node_a.close()
        node_b.close()
