"""Chat sessions: conversations the node keeps, so a turn continues from the previous KV.

A session holds the conversation's messages and its tokens exactly as the model saw them:
every prompt and answer so far, ending with what the chat template writes after the last
answer (e.g. "<end_of_turn>\\n"). A turn's prompt is those tokens followed by the new
messages, so it starts with the very tokens whose KV state the prefix cache stored after the
previous turn, and the conversation is never prefilled again.

`Sessions` is the contract the service and the API use; two stores keep it. This module's
`SessionStore` (the embedded mode) keeps sessions in memory and one JSON file each under
`<home>/sessions/` (written to a temp file and renamed: a crash leaves the old version or the
new one, never a torn file), so they survive restarts. The count is bounded (creating one
past `max_sessions` drops the expired ones, then the least recently used) and each expires
`ttl_s` after its last use. One client (its API key and address, `Session.owner`) holds
`max_per_owner` sessions at most: past it creating one is `TooManySessions`, so no client can
push everyone else's sessions out. With a remote archive, node/sessions/archived.py keeps them in the archive instead, so
any node of the fleet continues any session. Unknown, expired and malformed ids are all
`SessionNotFound`; `SessionsUnavailable` means the sessions cannot be read right now.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Protocol

import orjson

from shared.text import clip

log = logging.getLogger(__name__)
ID_PATTERN = re.compile(r"sess_[0-9a-f]{24}")


class SessionNotFound(LookupError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"No session '{clip(session_id)}' (unknown, deleted or expired)")
        self.session_id = session_id


class SessionsUnavailable(RuntimeError):
    """The store holding sessions cannot be reached (a remote archive that is down)."""


class TooManySessions(RuntimeError):
    """One client (API key and address) already holds `max_per_owner` sessions (HTTP 429)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"This client already holds {limit} sessions, the most one client may keep "
                         f"([server] max_sessions_per_client); DELETE /v1/sessions/{{id}} one it no longer "
                         f"uses, or let it expire")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    created: float
    updated: float
    messages: tuple[dict[str, str], ...] = ()
    tokens: tuple[int, ...] = ()
    owner: str = ""  # who created it (a digest of the API key and client address): bounds per client

    def to_json(self) -> bytes:
        return orjson.dumps({"id": self.id, "created": self.created, "updated": self.updated,
                             "messages": list(self.messages), "tokens": list(self.tokens), "owner": self.owner})

    @classmethod
    def from_json(cls, raw: bytes) -> "Session":
        data = orjson.loads(raw)
        return cls(str(data["id"]), float(data["created"]), float(data["updated"]),
                   tuple({"role": str(m["role"]), "content": str(m["content"])} for m in data["messages"]),
                   tuple(int(t) for t in data["tokens"]), str(data.get("owner", "")))


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_sessions: int = 1000
    ttl_s: float = 7 * 24 * 3600
    max_per_owner: int = 100  # sessions one client may hold; 0: no bound


def check_owner(sessions: Iterable[Session], owner: str, limits: SessionLimits, now: float) -> None:
    """TooManySessions when `owner` already holds its bound of live sessions."""
    if limits.max_per_owner <= 0:
        return
    held = sum(1 for session in sessions if session.owner == owner and now - session.updated <= limits.ttl_s)
    if held >= limits.max_per_owner:
        raise TooManySessions(limits.max_per_owner)


class Sessions(Protocol):
    """What the service and the API need of a session store."""

    limits: SessionLimits

    def __len__(self) -> int:
        """Sessions this node holds (all of them locally; those it has used, with an archive)."""
    async def create(self, owner: str = "") -> Session:
        """A new session of `owner`; TooManySessions when it holds `max_per_owner` already."""
    async def get(self, session_id: str) -> Session:
        """The session; SessionNotFound (unknown, expired, malformed) or SessionsUnavailable."""
    def lock(self, session_id: str) -> asyncio.Lock:
        """One turn at a time per session on this node; SessionNotFound for a malformed id."""
    async def save(self, session: Session) -> Session: ...
    async def delete(self, session_id: str) -> None: ...
    def describe(self, session: Session) -> dict[str, Any]: ...


def describe(session: Session, limits: SessionLimits) -> dict[str, Any]:
    return {"id": session.id, "object": "session", "created": int(session.created),
            "updated": int(session.updated), "expires_at": int(session.updated + limits.ttl_s),
            "messages": len(session.messages), "tokens": len(session.tokens)}


def valid_id(session_id: str) -> bool:
    return ID_PATTERN.fullmatch(session_id or "") is not None


def new_session(owner: str = "") -> Session:
    now = time.time()
    return Session(f"sess_{secrets.token_hex(12)}", now, now, owner=owner)


@dataclass(slots=True)
class SessionStore:
    """Sessions in memory and on disk; used from the event loop (file writes on a thread)."""

    directory: Path
    limits: SessionLimits = SessionLimits()
    _sessions: dict[str, Session] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    @classmethod
    def open(cls, directory: Path, limits: SessionLimits = SessionLimits()) -> "SessionStore":
        """Blocking: reads every session file once (call from a worker thread)."""
        store = cls(directory, limits)
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for path in directory.glob("sess_*.json"):
            try:
                session = Session.from_json(path.read_bytes())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("sessions: dropping unreadable %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            if session.id != path.stem or now - session.updated > limits.ttl_s:
                path.unlink(missing_ok=True)
                continue
            store._sessions[session.id] = session
        for stale in directory.glob(".tmp-*"):
            stale.unlink(missing_ok=True)
        store._trim(0)
        return store

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self, owner: str = "") -> Session:
        check_owner(self._sessions.values(), owner, self.limits, time.time())
        self._trim(1)
        session = new_session(owner)
        await self.save(session)
        return session

    async def get(self, session_id: str) -> Session:
        return self._get(session_id)

    def _get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id) if valid_id(session_id) else None
        if session is None:
            raise SessionNotFound(session_id)
        if time.time() - session.updated > self.limits.ttl_s:
            self._forget(session_id)
            raise SessionNotFound(session_id)
        return session

    def lock(self, session_id: str) -> asyncio.Lock:
        """One turn at a time per session: the next turn starts from this one's answer."""
        self._get(session_id)
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def save(self, session: Session) -> Session:
        session = replace(session, updated=time.time())
        self._sessions[session.id] = session
        await asyncio.to_thread(self._write, session)
        return session

    async def delete(self, session_id: str) -> None:
        self._get(session_id)
        await asyncio.to_thread(self._forget, session_id)

    def describe(self, session: Session) -> dict[str, Any]:
        return describe(session, self.limits)

    def _path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.json"

    def _write(self, session: Session) -> None:
        temp = self.directory / f".tmp-{session.id}-{secrets.token_hex(4)}"
        temp.write_bytes(session.to_json())
        os.replace(temp, self._path(session.id))

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._locks.pop(session_id, None)
        self._path(session_id).unlink(missing_ok=True)

    def _trim(self, room: int) -> None:
        """Drop expired sessions, then the least recently used (the idlest) until `room` more fit the bound."""
        now = time.time()
        for session in [s for s in self._sessions.values() if now - s.updated > self.limits.ttl_s]:
            self._forget(session.id)
        excess = len(self._sessions) + room - self.limits.max_sessions
        if excess <= 0:
            return
        oldest = sorted(self._sessions.values(), key=lambda s: s.updated)[:excess]
        for session in oldest:
            log.info("sessions: dropping %s (more than %d sessions)", session.id, self.limits.max_sessions)
            self._forget(session.id)
