"""Stored responses of the Responses API, kept in the archive so any node continues a chain.

A stored response is one archive value under the archive's session operations (which raise
when the archive cannot be reached, so a lost chain is a 503, never a silent fresh start),
named `response:<id>`: its JSON holds the response object (GET /v1/responses/{id}) and the
conversation it ended (every message of the chain, this response's output last, without
`instructions`), which a request with `previous_response_id` continues. With a remote ARCA (or
Redis) every node of the fleet reads the same chain; the embedded archive keeps it on this
node. A stored response lives `TTL_S` (OpenAI keeps responses 30 days).
"""

from __future__ import annotations

from typing import Any

import orjson

from node.archive.client import ArchiveClient
from node.archive.errors import ArchiveUnavailable
from node.serving.errors import NotFound, Overloaded
from node.serving.requests import ChatMessage, ToolCall

TTL_S = 30 * 24 * 3600
PREFIX = "response:"


def encode_message(message: ChatMessage) -> dict[str, Any]:
    record: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        record["tool_calls"] = [[call.id, call.name, call.arguments] for call in message.tool_calls]
    if message.tool_call_id is not None:
        record["tool_call_id"], record["name"] = message.tool_call_id, message.name
    return record


def decode_message(record: dict[str, Any]) -> ChatMessage:
    calls = tuple(ToolCall(str(i), str(n), str(a)) for i, n, a in record.get("tool_calls", ()))
    return ChatMessage(str(record["role"]), str(record["content"]), calls, record.get("tool_call_id"),
                       record.get("name"))


class ResponseStore:
    def __init__(self, archive: ArchiveClient) -> None:
        self.archive = archive

    async def get(self, response_id: str, param: str | None = None) -> tuple[dict, tuple[ChatMessage, ...]]:
        """The stored response and its conversation; NotFound when there is none."""
        try:
            blob = await self.archive.session_get(PREFIX + response_id)
        except ArchiveUnavailable:
            raise Overloaded("The archive holding stored responses cannot be reached; retry shortly") from None
        record = orjson.loads(blob) if blob is not None else None
        if not isinstance(record, dict) or "response" not in record:
            raise NotFound(f"No stored response with id {response_id!r} (never stored, deleted, expired, or sent "
                           "with store: false)", param=param, code="response_not_found")
        return record["response"], tuple(decode_message(item) for item in record.get("messages", ()))

    async def put(self, response: dict, messages: tuple[ChatMessage, ...]) -> None:
        blob = orjson.dumps({"response": response, "messages": [encode_message(m) for m in messages]})
        try:
            await self.archive.session_put(PREFIX + response["id"], blob, TTL_S)
        except ArchiveUnavailable:
            raise Overloaded("The archive holding stored responses cannot be reached; retry shortly") from None

    async def delete(self, response_id: str) -> None:
        await self.get(response_id)  # a 404 for one that is not there
        try:
            await self.archive.session_delete(PREFIX + response_id)
        except ArchiveUnavailable:
            raise Overloaded("The archive holding stored responses cannot be reached; retry shortly") from None
