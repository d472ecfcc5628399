"""The fleet tier against the real archive: node B restores what node A prefilled, a damaged
archived state is refused, and a down ARCA only costs the speed-up."""

from __future__ import annotations

import pytest

from node.archive_client import EmbeddedArchive, RemoteArchive
from node.cache import blob
from node.cache.fleet import FleetConfig, FleetTier, archive_key
from node.cache.keys import CacheIdentity
from node.cache.prefix_cache import PrefixCache, PrefixCacheConfig
from tests.conftest import free_port

from test_prefix_cache_hook import DOC, fake_state, run_prompt

IDENTITY = CacheIdentity(model_fingerprint="ab" * 32, runtime="test")


def make(directory) -> PrefixCache:
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
        await archive.kv_put(archive_key(boundary.key), data[:-1] + b"?")
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
