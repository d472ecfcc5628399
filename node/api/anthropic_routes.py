"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

A body is parsed into a ChatRequest (node/api/anthropic_schemas.py) and planned and answered by
the same service as OpenAI chat (L1, prefix cache, speculation, structured tool calls, the
savings ledger), inside the node's in-flight gate. The answer's turn items
(node/api/turn_items.py) become a `message` with `text` and `tool_use` blocks, or Anthropic's
stream: message_start, then per block content_block_start, content_block_delta (`text_delta`,
`input_json_delta`) and content_block_stop (a ping after the first block opens), then
message_delta (stop_reason, stop_sequence, the whole usage: what the prompt restored is known
only at the end) and message_stop. stop_reason is
`end_turn`, `max_tokens`, `stop_sequence` (one of the request's stop_sequences ended the text)
or `tool_use`. Usage follows Anthropic's meaning: `input_tokens` are the prompt tokens computed,
`cache_read_input_tokens` those restored (a prefix-cache restore, or all of them for an L1 hit).
Failures are in Anthropic's envelope (node/api/errors.py, by route), in a stream as its `error`
event. The key is accepted as `x-api-key` as well as the Bearer (node/api/app.py);
`anthropic-version` and `anthropic-beta` headers are accepted and change nothing.
"""

from __future__ import annotations

import json
import uuid
from functools import partial
from typing import AsyncIterator

from aiohttp import web

from node.api.anthropic_schemas import parse_messages_body
from node.api.errors import ErrorReply
from node.api.routes import answering, check_model, json_response, make_plan, read_json
from node.api.sse import named_frame, stream_frames
from node.api.state import STATE, tenant_of
from node.api.turn_items import CallArguments, CallStart, Item, Text, Turn, TurnEnd, turn_items
from node.serving.plan import Plan
from node.serving.requests import ChatRequest


def stop_reason(end: TurnEnd, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a finished turn."""
    if end.reason == "tool_calls":
        return "tool_use", None
    if end.reason == "length":
        return "max_tokens", None
    if end.stop_sequence is not None and end.stop_sequence in stops:
        return "stop_sequence", end.stop_sequence
    return "end_turn", None


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    cached = min(cached_tokens, prompt_tokens)
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def arguments(text: str) -> object:
    try:
        return json.loads(text) if text else {}
    except ValueError:  # cut by max_tokens: what was generated, as it is
        return text


def message_object(message_id: str, model: str, plan: Plan, turn: Turn, stops: tuple[str, ...]) -> dict:
    assert turn.end is not None
    content: list[dict] = []
    if turn.text or not turn.calls:
        content.append({"type": "text", "text": turn.text})
    content.extend({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments(call.arguments)}
                   for call in turn.calls)
    reason, sequence = stop_reason(turn.end, stops)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(plan.prompt_tokens, turn.end.cached_tokens, turn.end.completion_tokens)}


class BlockStream:
    """The content blocks of one streamed turn: which is open, and the frames that open and close them."""

    def __init__(self) -> None:
        self.open = -1                  # the open block's index (-1: none)
        self.count = 0                  # blocks opened so far
        self.calls: dict[int, int] = {}  # call index -> its block

    def close(self) -> list[bytes]:
        if self.open < 0:
            return []
        index, self.open = self.open, -1
        return [named_frame("content_block_stop", {"type": "content_block_stop", "index": index})]

    def start(self, content_block: dict) -> list[bytes]:
        frames = self.close()
        self.open, self.count = self.count, self.count + 1
        frames.append(named_frame("content_block_start", {"type": "content_block_start", "index": self.open,
                                                          "content_block": content_block}))
        if self.count == 1:
            frames.append(PING)
        return frames

    def delta(self, index: int, delta: dict) -> bytes:
        return named_frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


PING = named_frame("ping", {"type": "ping"})


async def stream_events(message_id: str, model: str, plan: Plan, items: AsyncIterator[Item],
                        stops: tuple[str, ...]) -> AsyncIterator[bytes]:
    """Anthropic's event sequence for one streamed turn."""
    yield named_frame("message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage(plan.prompt_tokens, 0, 0)}})
    blocks = BlockStream()
    async for item in items:
        frames: list[bytes] = []
        if isinstance(item, Text) and item.text:
            if blocks.open < 0 or blocks.open in blocks.calls.values():
                frames += blocks.start({"type": "text", "text": ""})
            frames.append(blocks.delta(blocks.open, {"type": "text_delta", "text": item.text}))
        elif isinstance(item, CallStart):
            frames += blocks.start({"type": "tool_use", "id": item.id, "name": item.name, "input": {}})
            blocks.calls[item.index] = blocks.open
        elif isinstance(item, CallArguments):
            frames.append(blocks.delta(blocks.calls[item.index], {"type": "input_json_delta",
                                                                  "partial_json": item.delta}))
        elif isinstance(item, TurnEnd):
            frames += blocks.close() if blocks.count else [PING]
            reason, sequence = stop_reason(item, stops)
            frames.append(named_frame("message_delta", {
                "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage(plan.prompt_tokens, item.cached_tokens, item.completion_tokens)}))
            frames.append(named_frame("message_stop", {"type": "message_stop"}))
        yield b"".join(frames)


def error_frame(reply: ErrorReply) -> bytes:
    return named_frame("error", reply.anthropic_body())


async def plan_messages(request: web.Request, *, count_only: bool = False) -> tuple[ChatRequest, Plan]:
    state = request.app[STATE]
    body, size = await read_json(request)
    req = parse_messages_body(body, count_only=count_only)
    check_model(state, req.model)
    await state.service.verify(req.options)  # schemas and grammars checked off the loop, within their budget
    return req, await make_plan(partial(state.service.plan_chat, tenant=tenant_of(request)), req, size)


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req, plan = await plan_messages(request)
    message_id = "msg_" + uuid.uuid4().hex
    model = state.model.model_id
    stops = req.options.stop
    async with answering(state, plan) as result:
        headers = {"X-Reame-Cache": result.cache}
        items = turn_items(plan, result)
        if plan.options.stream:
            return await stream_frames(request, headers, stream_events(message_id, model, plan, items, stops),
                                       error_frame)
        turn = await Turn.read(items)
        return json_response(message_object(message_id, model, plan, turn, stops), headers=headers)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as the model will see them (template, system, tools), nothing generated."""
    _, plan = await plan_messages(request, count_only=True)
    return json_response({"input_tokens": plan.prompt_tokens})


def setup_anthropic_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
