"""Sessions kept in the remote archive: two nodes see each other's turns, and an archive that
goes away costs the sessions this node never saw (503), not the ones it holds."""

from __future__ import annotations

import dataclasses

import pytest

from node.api.errors import error_reply
from node.archive.errors import ArchiveUnavailable
from node.sessions.archived import ArchivedSessionStore
from node.sessions.store import SessionLimits, SessionNotFound, SessionsUnavailable


class FakeArchive:
    """The session operations of an archive client, over a dict, that can be switched off."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.ttls: dict[str, int] = {}
        self.up = True

    def _check(self) -> None:
        if not self.up:
            raise ArchiveUnavailable("archive test is unreachable")

    async def session_get(self, session_id: str) -> bytes | None:
        self._check()
        return self.values.get(session_id)

    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None:
        self._check()
        self.values[session_id], self.ttls[session_id] = blob, ttl_s

    async def session_delete(self, session_id: str) -> None:
        self._check()
        self.values.pop(session_id, None)


async def test_two_nodes_continue_one_session():
    archive = FakeArchive()
    node_a, node_b = ArchivedSessionStore(archive), ArchivedSessionStore(archive)
    session = await node_a.create()
    assert archive.ttls[session.id] == 7 * 24 * 3600
    await node_a.save(dataclasses.replace(session, tokens=(1, 2, 3)))
    seen = await node_b.get(session.id)
    assert seen.tokens == (1, 2, 3)
    await node_b.save(dataclasses.replace(seen, tokens=(1, 2, 3, 4)))
    assert (await node_a.get(session.id)).tokens == (1, 2, 3, 4)  # every read asks the archive
    assert node_a.describe(seen)["id"] == session.id and len(node_a) == 1
    await node_b.delete(session.id)
    with pytest.raises(SessionNotFound):
        await node_a.get(session.id)
    for bad in ("sess_" + "0" * 24, "../etc/passwd", ""):
        with pytest.raises(SessionNotFound):
            await node_a.get(bad)
    with pytest.raises(SessionNotFound):
        node_a.lock("not-an-id")


async def test_an_archive_away_keeps_this_nodes_sessions():
    archive = FakeArchive()
    node_a, node_b = ArchivedSessionStore(archive), ArchivedSessionStore(archive)
    mine = await node_a.create()
    theirs = await node_b.create()
    archive.up = False
    assert (await node_a.get(mine.id)).id == mine.id  # this node's copy
    with pytest.raises(SessionsUnavailable):
        await node_a.get(theirs.id)  # never seen here: not a 404
    with pytest.raises(SessionsUnavailable):
        await node_a.create()
    saved = await node_a.save(dataclasses.replace(mine, tokens=(9, 9)))  # never raises
    archive.up = True
    assert (await node_a.get(mine.id)).tokens == (9, 9)  # the newer copy wins and is written back
    assert (await node_b.get(mine.id)).tokens == (9, 9) and saved.updated >= mine.updated


async def test_the_copies_are_bounded():
    archive = FakeArchive()
    store = ArchivedSessionStore(archive, SessionLimits(max_sessions=2))
    for _ in range(5):
        await store.create()
    assert len(store) == 2 and len(archive.values) == 5  # the archive's TTL and eviction bound the rest


def test_unavailable_sessions_are_503():
    reply = error_reply(SessionsUnavailable("Session 'x' cannot be read: archive down"))
    assert (reply.status, reply.code, reply.headers.get("Retry-After")) == (503, "sessions_unavailable", "1")
