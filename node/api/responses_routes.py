"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A body is parsed (node/api/responses_schemas.py) and, with `previous_response_id`, put after
the stored conversation it continues (node/api/responses_store.py, in the archive, so any node
of the fleet continues a chain); `instructions` go first as a system message. The result is a
ChatRequest planned and answered by the same service as OpenAI chat (L1, prefix cache,
speculation, structured output, tool calls, the savings ledger) inside the in-flight gate. The
answer's turn items (node/api/turn_items.py) become output items: one `message` with an
`output_text` part, and a `function_call` item per call. Streamed, the events carry OpenAI's
names and a `sequence_number`: response.created, response.in_progress, then per item
response.output_item.added, (message) response.content_part.added, response.output_text.delta,
response.output_text.done, response.content_part.done, (call)
response.function_call_arguments.delta / .done, response.output_item.done, and last
response.completed (response.incomplete when max_output_tokens cut it). A response is stored
unless `store` is false; one not stored cannot be retrieved nor continued (404).
"""

from __future__ import annotations

import json
import time
import uuid
from functools import partial
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from aiohttp import web

from node.api.errors import ErrorReply
from node.api.responses_schemas import ResponsesRequest, parse_responses_body
from node.api.responses_store import ResponseStore
from node.api.routes import answering, check_model, json_response, make_plan, read_json
from node.api.fields import Fields
from node.api.sse import named_frame, stream_frames
from node.api.state import STATE, NodeState, tenant_of
from node.api.turn_items import CallArguments, CallStart, Item, Text, Turn, TurnEnd, turn_items
from node.serving.plan import Plan
from node.serving.requests import ChatMessage, ChatRequest, ToolCall

def store_of(request: web.Request) -> ResponseStore:
    return ResponseStore(request.app[STATE].archive)


@dataclass(slots=True)
class Draft:
    """One response being built: its identity, the request's echo, and its output items."""

    id: str
    model: str
    req: ResponsesRequest
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict] = field(default_factory=list)

    def obj(self, status: str, usage: dict | None = None, end: TurnEnd | None = None) -> dict:
        options = self.req.options
        output = options.output
        tools = [{"type": "function", "name": tool.name, "description": tool.description,
                  "parameters": json.loads(tool.parameters), "strict": False}
                 for tool in (output.tools if output is not None else ())]
        choice: Any = "none" if output is None or output.choice is None else output.choice
        if choice == "function":
            choice = {"type": "function", "name": output.function if output is not None else None}
        incomplete = status == "incomplete"
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": self.req.instructions, "max_output_tokens": options.max_tokens, "model": self.model,
            "output": list(self.output), "parallel_tool_calls": True,
            "previous_response_id": self.req.previous_response_id, "store": self.req.store,
            "temperature": options.sampling.temperature, "top_p": options.sampling.top_p,
            "text": {"format": self.req.text_format}, "tool_choice": choice, "tools": tools, "truncation": "disabled",
            "metadata": self.req.metadata, "usage": usage,
        }


def usage(plan: Plan, end: TurnEnd) -> dict:
    cached = min(end.cached_tokens, plan.prompt_tokens)
    return {"input_tokens": plan.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": end.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": plan.prompt_tokens + end.completion_tokens}


def message_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "added" else []
    return {"type": "message", "id": item_id, "status": "in_progress" if status == "added" else status,
            "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def whole_response(draft: Draft, plan: Plan, turn: Turn) -> dict:
    assert turn.end is not None
    status = "incomplete" if turn.end.reason == "length" else "completed"
    if turn.text or not turn.calls:
        draft.output.append(message_item(new_id("msg_"), turn.text, status))
    draft.output.extend(call_item(new_id("fc_"), call.id, call.name, call.arguments, status) for call in turn.calls)
    return draft.obj(status, usage(plan, turn.end))


class EventWriter:
    """Responses stream events, numbered in order."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, **payload: Any) -> bytes:
        frame = named_frame(kind, {"type": kind, "sequence_number": self.number, **payload})
        self.number += 1
        return frame


async def stream_events(draft: Draft, plan: Plan, items: AsyncIterator[Item], event: EventWriter,
                        done: list[dict]) -> AsyncIterator[bytes]:
    """The stream of one response; the finished response object is appended to `done`."""
    yield event("response.created", response=draft.obj("in_progress")) + \
        event("response.in_progress", response=draft.obj("in_progress"))
    text_item: dict | None = None      # the open message item
    text = ""
    calls: dict[int, dict] = {}        # call index -> its item

    def close_text(status: str) -> bytes:
        nonlocal text_item
        if text_item is None:
            return b""
        index, item_id = draft.output.index(text_item), text_item["id"]
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        finished = message_item(item_id, text, status)
        draft.output[index] = finished
        text_item = None
        return (event("response.output_text.done", item_id=item_id, output_index=index, content_index=0, text=text,
                      logprobs=[])
                + event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                        part=part)
                + event("response.output_item.done", output_index=index, item=finished))

    async for item in items:
        frames = b""
        if isinstance(item, Text) and item.text:
            if text_item is None:
                text_item = message_item(new_id("msg_"), "", "added")
                draft.output.append(text_item)
                index = len(draft.output) - 1
                frames += event("response.output_item.added", output_index=index, item=text_item)
                frames += event("response.content_part.added", item_id=text_item["id"], output_index=index,
                                content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                       "logprobs": []})
            text += item.text
            frames += event("response.output_text.delta", item_id=text_item["id"],
                            output_index=draft.output.index(text_item), content_index=0, delta=item.text, logprobs=[])
        elif isinstance(item, CallStart):
            frames += close_text("completed")
            added = call_item(new_id("fc_"), item.id, item.name, "", "in_progress")
            draft.output.append(added)
            calls[item.index] = added
            frames += event("response.output_item.added", output_index=len(draft.output) - 1, item=added)
        elif isinstance(item, CallArguments):
            call = calls[item.index]
            call["arguments"] += item.delta
            frames += event("response.function_call_arguments.delta", item_id=call["id"],
                            output_index=draft.output.index(call), delta=item.delta)
        elif isinstance(item, TurnEnd):
            status = "incomplete" if item.reason == "length" else "completed"
            if text_item is None and not calls:  # nothing was said: still one (empty) message
                text_item = message_item(new_id("msg_"), "", "added")
                draft.output.append(text_item)
                frames += event("response.output_item.added", output_index=len(draft.output) - 1, item=text_item)
                frames += event("response.content_part.added", item_id=text_item["id"],
                                output_index=len(draft.output) - 1, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            frames += close_text(status)
            for call in calls.values():
                index = draft.output.index(call)
                finished = {**call, "status": status}
                draft.output[index] = finished
                frames += event("response.function_call_arguments.done", item_id=call["id"], output_index=index,
                                name=call["name"], arguments=call["arguments"])
                frames += event("response.output_item.done", output_index=index, item=finished)
            final = draft.obj(status, usage(plan, item))
            done.append(final)
            frames += event("response.incomplete" if status == "incomplete" else "response.completed", response=final)
        yield frames


def output_message(response: dict) -> ChatMessage:
    """A response's output as the assistant message the next response of the chain continues."""
    text = "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])
    calls = tuple(ToolCall(item["call_id"], item["name"], item["arguments"] or "{}")
                  for item in response["output"] if item["type"] == "function_call")
    return ChatMessage("assistant", text, tool_calls=calls)


async def create(request: web.Request) -> web.StreamResponse:
    state: NodeState = request.app[STATE]
    store = store_of(request)
    body, size = await read_json(request)
    previous = Fields(body).string("previous_response_id")
    history: tuple[ChatMessage, ...] = ()
    if previous is not None:
        _, history = await store.get(previous, "previous_response_id")
    calls = {call.id: call.name for message in history for call in message.tool_calls}
    req = parse_responses_body(body, calls)
    check_model(state, req.model)
    await state.service.verify(req.options)  # schemas and grammars checked off the loop, within their budget
    conversation = (*history, *req.input)
    system = (ChatMessage("system", req.instructions),) if req.instructions else ()
    chat = ChatRequest(req.model, (*system, *conversation), req.options)
    plan = await make_plan(partial(state.service.plan_chat, tenant=tenant_of(request)), chat, size)
    draft = Draft(new_id("resp_"), state.model.model_id, req)

    async def keep(response: dict) -> None:
        if req.store:
            await store.put(response, (*conversation, output_message(response)))

    async with answering(state, plan) as result:
        headers = {"X-Reame-Cache": result.cache}
        items = turn_items(plan, result)
        if plan.options.stream:
            done: list[dict] = []
            writer = EventWriter()

            async def frames() -> AsyncIterator[bytes]:
                async for data in stream_events(draft, plan, items, writer, done):
                    if done:  # the last frames: stored before the client reads response.completed
                        await keep(done.pop())
                    yield data

            def failure(reply: ErrorReply) -> bytes:
                return writer("error", code=reply.code, message=reply.message, param=reply.param)

            return await stream_frames(request, headers, frames(), failure)
        response = whole_response(draft, plan, await Turn.read(items))
        await keep(response)
        return json_response(response, headers=headers)


async def retrieve(request: web.Request) -> web.Response:
    response, _ = await store_of(request).get(request.match_info["response_id"])
    return json_response(response)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    await store_of(request).delete(response_id)
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


def setup_responses_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
