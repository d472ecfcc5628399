"""Chat turns inside a session: the prompt continues the session's tokens, the answer extends them.

A turn's request carries only its new messages. Its prompt is the session's tokens (every
earlier prompt and answer, ending with what closes the last answer) followed by the new
messages as the chat template renders them after an answer (node/template_cuts.py), so the
prefix cache restores the conversation instead of prefilling it. The turn's engine request
asks for its final state (`store_final_state`): when the answer is complete the engine hands
the cache the KV of prompt + answer, up to the answer's last block boundary, before it frees
the slot, so the answer's KV is computed once, while it is generated. After a completed turn
the answer is appended as the very token ids the model generated (then the template's
closing tokens) and the session is written to disk; the next turn, on this node, after a
restart, or on another node of the fleet, restores all of it. An answer replayed from L1 has
no token ids: its text is tokenized instead, and the next turn prefills it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from node.sessions import Session, SessionStore
from node.template_cuts import turn_suffix
from node.warm import WarmResult, held_tokens


@dataclass(frozen=True, slots=True)
class SessionTurn:
    session: Session
    new_messages: tuple[dict[str, str], ...]
    prompt_tokens: tuple[int, ...]


class SessionTurns:
    def __init__(self, service: Any, store: SessionStore) -> None:
        self.service = service
        self.store = store

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

    async def complete(self, turn: SessionTurn, answer: str, generated: Sequence[int] | None = None) -> Session:
        """Record a completed answer (`generated`: its token ids; None: tokenize `answer`)."""
        service = self.service
        messages = (*turn.session.messages, *turn.new_messages, {"role": "assistant", "content": answer})
        closing = turn_suffix(service.model.template, messages, ()).closing
        if generated is None:
            generated = service.engine.tokenize(answer, add_bos=False, special=False)
        tokens = (*turn.prompt_tokens, *generated, *service.engine.tokenize(closing, add_bos=False, special=True))
        return await self.store.save(replace(turn.session, messages=messages, tokens=tokens))

    async def load(self, session: Session) -> WarmResult | None:
        """Bring the session's KV into RAM (from disk or the fleet), prefilling what is missing."""
        if not session.tokens or self.service.cache is None:
            return None
        return await self.service.warm(session.tokens)

    async def save(self, session: Session) -> int:
        """Wait for the session's KV to be written to disk; the tokens of it the cache holds."""
        cache = self.service.cache
        if cache is None or not session.tokens:
            return 0
        await asyncio.to_thread(cache.flush)
        return held_tokens(cache, session.tokens)
