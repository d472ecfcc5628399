"""Chat sessions kept in the remote archive, so any node of the fleet continues any session.

A session is one archive value (its JSON, the same as the local store's files) that lives
`ttl_s` after its last use; the session's KV states already travel through L3. Every read
asks the archive, so a turn on node B continues what node A answered a moment ago.

This node also keeps the sessions it has used (bounded by `max_sessions`, least recently
used dropped first). While the archive cannot be reached that copy serves this node's own
sessions, and a save that failed is written back on the next read that reaches the archive
(the newer of the two versions, by `updated`, wins). A session this node never saw is then
`SessionsUnavailable` (HTTP 503), never `SessionNotFound`. Turns of one session on two nodes
at the same moment are not serialised: the later save wins.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Protocol

from node.archive.errors import ArchiveUnavailable
from node.sessions.store import (
    Session, SessionLimits, SessionNotFound, SessionsUnavailable, check_owner, describe, new_session, valid_id,
)

log = logging.getLogger(__name__)


class SessionArchive(Protocol):
    """The session operations of node/archive/client.py's ArchiveClient."""

    async def session_get(self, session_id: str) -> bytes | None: ...
    async def session_put(self, session_id: str, blob: bytes, ttl_s: int) -> None: ...
    async def session_delete(self, session_id: str) -> None: ...


class ArchivedSessionStore:
    def __init__(self, archive: SessionArchive, limits: SessionLimits = SessionLimits()) -> None:
        self.archive = archive
        self.limits = limits
        self._known: OrderedDict[str, Session] = OrderedDict()  # this node's copies, oldest use first
        self._unsaved: set[str] = set()  # saved only here: the archive was away
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._known)

    @property
    def _ttl(self) -> int:
        return max(1, int(self.limits.ttl_s))

    def _remember(self, session: Session) -> None:
        self._known[session.id] = session
        self._known.move_to_end(session.id)
        while len(self._known) > self.limits.max_sessions:
            dropped, _ = self._known.popitem(last=False)
            self._unsaved.discard(dropped)

    async def create(self, owner: str = "") -> Session:
        check_owner(self._known.values(), owner, self.limits, time.time())  # the ones this node holds
        session = new_session(owner)
        try:
            await self.archive.session_put(session.id, session.to_json(), self._ttl)
        except ArchiveUnavailable as exc:
            raise SessionsUnavailable(f"Sessions cannot be created while the archive is unavailable: {exc}") from None
        self._remember(session)
        return session

    async def get(self, session_id: str) -> Session:
        if not valid_id(session_id):
            raise SessionNotFound(session_id)
        local = self._known.get(session_id)
        try:
            raw = await self.archive.session_get(session_id)
        except ArchiveUnavailable as exc:
            if local is None:
                raise SessionsUnavailable(f"Session '{session_id}' cannot be read: {exc}") from None
            log.warning("sessions: the archive is unavailable; continuing %s from this node's copy", session_id)
            return local
        stored = self._parse(session_id, raw)
        if local is not None and session_id in self._unsaved and (stored is None or local.updated > stored.updated):
            await self._put(local)  # a save that missed the archive: the newer version wins
            return local
        self._unsaved.discard(session_id)  # the archive's version is the newer one
        if stored is None:
            self._known.pop(session_id, None)
            raise SessionNotFound(session_id)
        self._remember(stored)
        return stored

    @staticmethod
    def _parse(session_id: str, raw: bytes | None) -> Session | None:
        if raw is None:
            return None
        try:
            session = Session.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("sessions: the archive holds an unreadable %s: %s", session_id, exc)
            return None
        return session if session.id == session_id else None

    def lock(self, session_id: str) -> asyncio.Lock:
        if not valid_id(session_id):
            raise SessionNotFound(session_id)
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _put(self, session: Session) -> bool:
        try:
            await self.archive.session_put(session.id, session.to_json(), self._ttl)
        except ArchiveUnavailable as exc:
            log.warning("sessions: %s kept on this node only until the archive is back: %s", session.id, exc)
            self._unsaved.add(session.id)
            return False
        self._unsaved.discard(session.id)
        return True

    async def save(self, session: Session) -> Session:
        """Never raises: an answer already given must not fail because the archive is away."""
        session = replace(session, updated=time.time())
        self._remember(session)
        await self._put(session)
        return session

    async def delete(self, session_id: str) -> None:
        await self.get(session_id)
        try:
            await self.archive.session_delete(session_id)
        except ArchiveUnavailable as exc:
            raise SessionsUnavailable(f"Session '{session_id}' cannot be deleted now: {exc}") from None
        self._known.pop(session_id, None)
        self._unsaved.discard(session_id)

    def describe(self, session: Session) -> dict[str, Any]:
        return describe(session, self.limits)
