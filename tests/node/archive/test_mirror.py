"""The L4 mirror: corpus streams after a cursor into a sink, from the embedded archive and from
a real ARCA over RESP, with the local copy that survives a restart."""

from __future__ import annotations

from arca.archive import ArchiveConfig
from node.archive.client import EmbeddedArchive, RemoteArchive
from node.archive.mirror import MAGIC, CorpusMirror
from node.speculative.palimpsest import Palimpsest
from tests.arca.arca_harness import start_server

NS = b"model-fingerprint"


async def test_embedded_corpus_flows_into_the_sink_incrementally(tmp_path):
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=64 << 20))
    try:
        for i in range(3):
            await archive.observe(NS, [i, 10, 11, 12, 13])
        await archive.observe(b"other-model", [99, 98, 97, 96])
        seen: list[list[int]] = []
        mirror = CorpusMirror(archive, NS, seen.append, batch=2)
        assert await mirror.sync() == 3 and [s[0] for s in seen] == [0, 1, 2]
        assert await mirror.sync() == 0
        await archive.observe(NS, [7, 7, 7, 7])
        assert await mirror.sync() == 1 and seen[-1] == [7, 7, 7, 7]
    finally:
        await archive.close()


async def test_remote_mirror_keeps_a_local_copy_and_resumes_after_a_restart(tmp_path):
    server = start_server(tmp_path)
    remote = RemoteArchive("127.0.0.1", server.port, timeout_ms=2000)
    path = tmp_path / "home" / "mirror" / "fp.l4"
    try:
        await remote.start()
        for i in range(5):
            await remote.observe(NS, [100 + i, 1, 2, 3, 4, 5])
        first: list[list[int]] = []
        mirror = CorpusMirror(remote, NS, first.append, path=path, interval_s=0.01)
        await mirror.start()
        assert await mirror.caught_up(10) and len(first) == 5
        await mirror.close()
        with open(path, "ab") as handle:  # a crash in the middle of appending a record
            handle.write(b"\x09\x00\x00")
        await remote.observe(NS, [200, 1, 2, 3])

        palimpsest = Palimpsest()
        again = CorpusMirror(remote, NS, palimpsest.add, path=path, interval_s=0.01)
        await again.start()  # the five come from disk, only the new one over the network
        assert again.streams == 5
        assert await again.caught_up(10) and again.streams == 6
        await again.close()
        assert path.read_bytes().startswith(MAGIC)
        palimpsest.ingest()
        assert palimpsest.continuation([104, 1, 2, 3], 2) == (4, 5)
        assert palimpsest.stats().streams == 6
    finally:
        await remote.close()
        server.stop()


async def test_the_local_copy_is_compacted_to_its_budget(tmp_path):
    archive = EmbeddedArchive(ArchiveConfig(directory=tmp_path / "arca", max_bytes=64 << 20))
    path = tmp_path / "copy.l4"
    try:
        for i in range(40):
            await archive.observe(NS, [i] * 10)
        mirror = CorpusMirror(archive, NS, lambda tokens: None, path=path, max_tokens=100, batch=7)
        await mirror.sync()
        reloaded: list[list[int]] = []
        restarted = CorpusMirror(archive, NS, reloaded.append, path=path, max_tokens=100)
        await restarted.start()
        await restarted.close()
        assert restarted.cursor == mirror.cursor and 1 <= len(reloaded) <= 10
        assert reloaded[-1] == [39] * 10
        assert path.stat().st_size < len(MAGIC) + 21 * (12 + 40)
    finally:
        await archive.close()
