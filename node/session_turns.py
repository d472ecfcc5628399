"""Chat turns inside a session: the prompt continues the session's tokens, the answer extends them.

A turn's request carries only its new messages. Its prompt is the session's tokens (every
earlier prompt and answer, ending with what closes the last answer) followed by the new
messages as the chat template renders them after an answer (node/template_cuts.py), so the
prefix cache restores the conversation instead of prefilling it. After a completed turn the
answer is appended (its text tokenized as text, then the template's closing tokens), the
session is written to disk, and the whole conversation is prefilled into the cache in the
background ("sealed"), so the next turn, on this node, after a restart, or on another node of
the fleet, restores all of it. The next turn of the same session waits for the seal instead
of prefilling the same tokens a second time; a seal that would store less than the cache's
`min_gain_tokens` beyond what it already holds is skipped (the next turn stores it).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Mapping, Sequence

from node.sessions import Session, SessionStore
from node.template_cuts import turn_suffix
from node.warm import WarmResult, held_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionTurn:
    session: Session
    new_messages: tuple[dict[str, str], ...]
    prompt_tokens: tuple[int, ...]


class SessionTurns:
    def __init__(self, service: Any, store: SessionStore) -> None:
        self.service = service
        self.store = store
        self._seals: dict[str, asyncio.Task[Any]] = {}

    def begin(self, session: Session, new_messages: Sequence[Mapping[str, str]]) -> SessionTurn:
        """The turn's prompt tokens (blocking: tokenizes). Raises template_cuts.CutError."""
        service = self.service
        new = tuple({"role": m["role"], "content": m["content"]} for m in new_messages)
        if not session.tokens:
            tokens = service.chat_tokens([*session.messages, *new])
        else:
            opening = turn_suffix(service.model.template, session.messages, new).opening
            tokens = (*session.tokens, *service.engine.tokenize(opening, add_bos=False, special=True))
        return SessionTurn(session, new, tuple(tokens))

    async def complete(self, turn: SessionTurn, answer: str) -> Session:
        """Record a completed answer, persist the session and seal its conversation."""
        service = self.service
        messages = (*turn.session.messages, *turn.new_messages, {"role": "assistant", "content": answer})
        closing = turn_suffix(service.model.template, messages, ()).closing
        tokens = (*turn.prompt_tokens, *service.engine.tokenize(answer, add_bos=False, special=False),
                  *service.engine.tokenize(closing, add_bos=False, special=True))
        session = await self.store.save(replace(turn.session, messages=messages, tokens=tokens))
        if self._worth_sealing(tokens):
            task = asyncio.create_task(self._seal(session))
            self._seals[session.id] = task
            task.add_done_callback(partial(self._forget_seal, session.id))
        return session

    async def settled(self, session_id: str) -> None:
        """Wait until the session's last seal is done (its KV is then held by the cache)."""
        task = self._seals.get(session_id)
        if task is not None:
            await asyncio.wait({task})

    async def load(self, session: Session) -> WarmResult | None:
        """Bring the session's KV into RAM (from disk or the fleet), prefilling what is missing."""
        await self.settled(session.id)
        if not session.tokens or self.service.cache is None:
            return None
        return await self.service.warm(session.tokens)

    async def save(self, session: Session) -> int:
        """Wait for the session's KV to be written to disk; the tokens of it the cache holds."""
        await self.settled(session.id)
        cache = self.service.cache
        if cache is None or not session.tokens:
            return 0
        await asyncio.to_thread(cache.flush)
        return held_tokens(cache, session.tokens)

    async def close(self) -> None:
        for task in list(self._seals.values()):
            task.cancel()
        if self._seals:
            await asyncio.wait(set(self._seals.values()))

    def _forget_seal(self, session_id: str, task: asyncio.Task[Any]) -> None:
        if self._seals.get(session_id) is task:
            del self._seals[session_id]

    def _worth_sealing(self, tokens: Sequence[int]) -> bool:
        cache = self.service.cache
        if cache is None:
            return False
        boundaries = cache.chain.restorable(tokens)
        if not boundaries:
            return False
        gain = boundaries[-1].n_tokens - cache.longest_local(boundaries)
        return gain >= max(cache.config.min_gain_tokens, 1)

    async def _seal(self, session: Session) -> None:
        try:
            result = await self.service.warm(session.tokens)
            log.debug("session %s sealed: %s", session.id, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # overloaded or closing: the next turn prefills instead
            log.info("session %s: storing the conversation's KV failed: %s", session.id, exc)
