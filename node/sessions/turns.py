"""Chat turns inside a session: the prompt continues the session's tokens, the answer extends them.

A turn's request carries only its new messages. Its prompt is the session's tokens (every
earlier prompt and answer, ending with what closes the last answer) followed by the new
messages as the chat template renders them after an answer (node/sessions/cuts.py), so the
prefix cache restores the conversation instead of prefilling it. The turn's engine request
asks for its final state (`store_final_state`): when the answer is complete the engine hands
the cache the KV of prompt + answer, up to the answer's last block boundary, before it frees
the slot, so the answer's KV is computed once, while it is generated. After a completed turn
the answer is appended as the very token ids the model generated (then the template's
closing tokens) and the session is written to disk; the next turn, on this node, after a
restart, or on another node of the fleet, restores all of it. An answer replayed from L1 has
no token ids: its text is tokenized instead, and the next turn prefills it.

Messages are kept as the template reads them, tool calls and results included. An answer that
is a forced call is kept as the assistant's `tool_calls`, with the id the client was given
(`SessionTurn.call_id`), so the next turn's tool message can answer it (`history_calls`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from node.cache.prefix_cache import PrefixCache
from node.models.templates import ChatTemplate
from node.sessions.cuts import turn_suffix
from node.sessions.store import Session, Sessions
from node.sessions.warm import WarmResult, held_tokens


class TurnTokens(Protocol):
    """How a turn's text becomes tokens (node/serving/prompts.py's `Prompts` is one)."""

    def chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
             ) -> tuple[int, ...]: ...

    def continuation(self, text: str, *, special: bool = True) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class SessionTurn:
    session: Session
    new_messages: tuple[dict[str, Any], ...]
    prompt_tokens: tuple[int, ...]
    call_id: str | None = None  # the id of the call a forced-call answer makes


class SessionTurns:
    """Turns of the sessions in `store`; `warm` prefills tokens into `cache` (None: cache off)."""

    def __init__(self, store: Sessions, template: ChatTemplate, tokens: TurnTokens,
                 cache: PrefixCache | None, warm: Callable[[Sequence[int], str], Awaitable[WarmResult]]) -> None:
        self.store = store
        self.template = template
        self.tokens = tokens
        self.cache = cache
        self.warm = warm

    def begin(self, session: Session, new_messages: Sequence[Mapping[str, Any]],
              call_id: str | None = None) -> SessionTurn:
        """The turn's prompt tokens (blocking: tokenizes); `call_id` when the answer is a forced
        call. Raises cuts.CutError."""
        new = tuple(dict(message) for message in new_messages)  # tool calls and results kept as sent
        if not session.tokens:
            tokens = self.tokens.chat([*session.messages, *new])
        else:
            opening = turn_suffix(self.template, session.messages, new).opening
            tokens = (*session.tokens, *self.tokens.continuation(opening))
        return SessionTurn(session, new, tuple(tokens), call_id)

    async def complete(self, turn: SessionTurn, answer: str, generated: Sequence[int] | None = None) -> Session:
        """Record a completed answer (`generated`: its token ids; None: tokenize `answer`)."""
        messages = (*turn.session.messages, *turn.new_messages, answer_message(answer, turn.call_id))
        closing = turn_suffix(self.template, messages, ()).closing
        if generated is None:
            generated = self.tokens.continuation(answer, special=False)
        tokens = (*turn.prompt_tokens, *generated, *self.tokens.continuation(closing))
        return await self.store.save(replace(turn.session, messages=messages, tokens=tokens))

    async def load(self, session: Session, scope: str = "") -> WarmResult | None:
        """Bring the session's KV into RAM (from disk or the fleet), prefilling what is missing,
        under the asking tenant's `scope` (the one its turns ran under)."""
        if not session.tokens or self.cache is None:
            return None
        return await self.warm(session.tokens, scope)

    async def save(self, session: Session, scope: str = "") -> int:
        """Wait for the session's KV to be written to disk; the tokens of it the cache holds
        for the asking tenant."""
        cache = self.cache
        if cache is None or not session.tokens:
            return 0
        await asyncio.to_thread(cache.flush)
        return held_tokens(cache, session.tokens, scope)


def answer_message(answer: str, call_id: str | None) -> dict[str, Any]:
    """The answer as the history keeps it: a forced call as the assistant's `tool_calls` (its
    text is the call's JSON object, node/models/tool_turns.py renders it back the same way)."""
    try:
        value = json.loads(answer) if call_id is not None else None
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or "arguments" not in value:
        return {"role": "assistant", "content": answer}
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": value["name"], "arguments": value["arguments"]}}]}


def history_calls(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The ids of the tool calls in a session's history, with their functions."""
    return {call["id"]: call["function"]["name"] for message in messages for call in message.get("tool_calls") or ()}
