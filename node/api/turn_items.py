"""One chat answer as the items of an assistant turn: text, tool calls, the end.

The Messages API (node/api/anthropic_routes.py) and the Responses API
(node/api/responses_routes.py) answer one choice of a chat plan in blocks or output items,
not in OpenAI's chat deltas. `turn_items(plan, answer)` reads choice 0's events through the
same tool-call reader as chat (node/api/shapes.py's `tool_readers`) and yields `Text` pieces,
`CallStart` / `CallArguments` for each call (streamed as they are generated for a forced call,
whole at the end for `auto`), and one `TurnEnd`. `Turn` gathers them for a non-streamed answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

from node.api.shapes import tool_readers
from node.serving.answer import Answer
from node.serving.plan import ChoiceText, Plan
from node.serving.tools import Piece


@dataclass(frozen=True, slots=True)
class Text:
    """A piece of the answer's text."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A tool call begins: its index among the turn's calls, its id and the function it calls."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    """More of call `index`'s arguments."""

    index: int
    delta: str  # a piece of the call's arguments (JSON text)


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The turn is over: why, and what it cost."""

    reason: str  # "stop" | "length" | "tool_calls"
    stop_sequence: str | None
    completion_tokens: int
    cached_tokens: int


Item = Text | CallStart | CallArguments | TurnEnd


def _items(pieces: list[Piece]) -> Iterator[Item]:
    for piece in pieces:
        if piece[0] == "content":
            yield Text(piece[1])
            continue
        delta = piece[2]
        function = delta.get("function", {})
        if "id" in delta:
            yield CallStart(piece[1], delta["id"], function.get("name", ""))
        if function.get("arguments"):
            yield CallArguments(piece[1], function["arguments"])


async def turn_items(plan: Plan, result: Answer) -> AsyncIterator[Item]:
    """Choice 0 of the answer as turn items (plans of the Messages and Responses APIs have one)."""
    readers = tool_readers(plan, 1)
    reader = readers[0] if readers else None
    async for event in result.events():
        if isinstance(event, ChoiceText):
            for item in _items(reader.feed(event.text) if reader is not None else [("content", event.text)]):
                yield item
            continue
        reason = event.finish_reason
        if reader is not None:
            pieces, reason = reader.finish(reason)
            for item in _items(pieces):
                yield item
        yield TurnEnd(reason, event.stop_sequence, event.completion_tokens, event.cached_tokens)


@dataclass(slots=True)
class Call:
    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Turn:
    """A whole non-streamed turn."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    end: TurnEnd | None = None

    def add(self, item: Item) -> None:
        if isinstance(item, Text):
            self.text += item.text
        elif isinstance(item, CallStart):
            self.calls.append(Call(item.id, item.name))
        elif isinstance(item, CallArguments):
            self.calls[item.index].arguments += item.delta
        else:
            self.end = item

    @classmethod
    async def read(cls, items: AsyncIterator[Item]) -> "Turn":
        turn = cls()
        async for item in items:
            turn.add(item)
        return turn
