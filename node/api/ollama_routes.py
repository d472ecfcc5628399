"""Ollama's API on the node's port: /api/chat, /api/generate, /api/tags, /api/show, /api/ps,
/api/version, /api/embed and /api/embeddings.

Requests take the same path as OpenAI's chat (node/api/routes.py): parsed into the serving
layer's requests (node/api/ollama_schemas.py), planned by the service (chat template, L1 key,
prefix cache, speculation, sessions through `X-Reame-Session`), admitted under the in-flight
limit and answered as NDJSON chunks (`"stream": false`: one object; node/api/ollama_shapes.py).
Every answer carries `X-Reame-Cache`. Errors are Ollama's `{"error": "..."}` with the status
the node's one error mapping gives (node/api/errors.py writes that envelope for every /api/ path);
a failure after a stream started is a last line `{"error": "..."}`.

The answer's length: `num_predict` tokens (512 when absent), clipped to what the window
(`num_ctx`, else the node's context) leaves after the prompt; -1 and -2 fill the window. A
prompt that leaves no room is a 400.

/api/generate renders `prompt` (and `system`) through the chat template as one user turn,
unless `raw`. Its final object carries `context`: the prompt's and the answer's token ids;
sending it back continues from those tokens (the new prompt, rendered as a turn, follows them).
An empty prompt, or /api/chat with no messages, is Ollama's way to load the model: it is loaded
already, and the answer says `done_reason` "load".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, TypeVar

import orjson
from aiohttp import web

from node import __version__
from node.api.errors import ErrorReply
from node.api.ollama_schemas import (
    OllamaGenerate, Window, parse_chat, parse_embed, parse_generate, parse_load, parse_model, parse_window,
)
from node.api.ollama_shapes import OllamaReply, loaded, model_entry, model_show
from node.api.routes import answering, chat_turn, check_model, json_response, make_plan, read_json
from node.api.shapes import tool_readers
from node.api.sse import streamed
from node.api.state import STATE, NodeState, tenant_of
from node.serving.errors import ContextLengthExceeded, InvalidRequest, UnsupportedFeature
from node.serving.plan import Plan
from node.serving.requests import ChatMessage, ChatRequest, CompletionRequest
from node.serving.service import CompletionService

NDJSON = "application/x-ndjson"
Req = TypeVar("Req", ChatRequest, OllamaGenerate)


def reply_name(state: NodeState, body: Any) -> str:
    """The model name an answer repeats: the request's, as Ollama does."""
    name = body.get("model") if isinstance(body, dict) else None
    return name if isinstance(name, str) and name else state.model.model_id


async def fitted_plan(planner: Callable[[Req], Plan], req: Req, size: int, window: Window, n_ctx: int) -> Plan:
    """The plan with max_tokens fitted to the window the prompt leaves (module docstring)."""
    plan = await make_plan(planner, req, size)
    limit = window.num_ctx or n_ctx
    room = limit - plan.prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(f"The prompt of {plan.prompt_tokens} tokens leaves no room in the context of "
                                    f"{limit} tokens", param="options.num_ctx" if window.num_ctx else None)
    wanted = room if window.max_tokens is None else min(window.max_tokens, room)
    if wanted == req.options.max_tokens:
        return plan
    return await make_plan(planner, dataclasses.replace(req, options=dataclasses.replace(
        req.options, max_tokens=wanted)), size)


def refuse_tools(state: NodeState, req: ChatRequest) -> None:
    """Ollama's tools are the model's choice: they need a template that renders them."""
    output = req.options.output
    template = state.model.template
    if output is not None and output.choice == "auto" and not template.renders_tools:
        raise UnsupportedFeature(f"'{state.model.model_id}' does not support tools: its chat template "
                                 f"({template.name}) renders no tools and marks no calls", param="tools")


async def chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body, size = await read_json(request)
    name = reply_name(state, body)
    if isinstance(body, dict) and body.get("messages") in (None, []):
        check_model(state, parse_load(body, state.model.n_ctx))
        return json_response(loaded(name, chat=True))
    window = parse_window(body, state.model.n_ctx)
    async with chat_turn(request, state, body, parse_chat) as (req, planner, headers):
        refuse_tools(state, req)
        plan = await fitted_plan(planner, req, size, window, state.model.n_ctx)
        return await answer(request, state, plan, name, chat=True, headers=headers)


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body, size = await read_json(request)
    req = parse_generate(body)
    check_model(state, req.model)
    await state.service.verify(req.options)
    name = reply_name(state, body)
    window = parse_window(body, state.model.n_ctx)
    if not req.prompt and req.context is None:
        return json_response(loaded(name, chat=False))
    if req.context is not None and max(req.context) >= state.model.n_vocab:
        raise InvalidRequest(f"'context' holds token ids outside the vocabulary of {state.model.n_vocab}",
                             param="context", code="invalid_value")
    service = state.service
    tenant = tenant_of(request)
    plan = await fitted_plan(lambda r: plan_generate(service, r, tenant), req, size, window, state.model.n_ctx)
    return await answer(request, state, plan, name, chat=False, context=not req.raw)


def plan_generate(service: CompletionService, req: OllamaGenerate, tenant: str) -> Plan:
    """A prompt as one user turn through the chat template, or raw; after `context`'s tokens when
    given; for the tenant's caches."""
    messages = ((ChatMessage("system", req.system),) if req.system else ()) + (ChatMessage("user", req.prompt),)
    if req.context is None:
        if req.raw:
            return service.plan_completion(CompletionRequest(req.model, (req.prompt,), False, req.options),
                                           tenant=tenant)
        return service.plan_chat(ChatRequest(req.model, messages, req.options), tenant=tenant)
    if req.raw:
        added = service.prompts.continuation(req.prompt) if req.prompt else ()
    else:
        added = service.prompts.chat([message.as_dict() for message in messages])
        if added and added[0] == service.model.bos_token:  # the context begins with it already
            added = added[1:]
    return service.plan_completion(CompletionRequest(req.model, (req.context + tuple(added),), False, req.options),
                                   tenant=tenant)


async def answer(request: web.Request, state: NodeState, plan: Plan, name: str, *, chat: bool,
                 headers: dict[str, str] | None = None, context: bool = False) -> web.StreamResponse:
    readers = tool_readers(plan, 1)
    reply = OllamaReply(name, chat, readers[0] if readers else None, plan.options.logprobs is not None)
    async with answering(state, plan) as result:
        headers = {"X-Reame-Cache": result.cache, **(headers or {})}

        def final(whole: bool) -> dict:
            tokens = None
            if context:
                generated = result.generated
                if generated is None:  # an L1 answer: its text, as the model reads it
                    generated = tuple(state.engine.tokenize("".join(reply.text), add_bos=False, special=False))
                tokens = [*plan.jobs[0].prompt_tokens, *generated]
            return reply.final(plan.prompt_tokens, whole=whole, context=tokens)

        if not plan.options.stream:
            async for event in result.events():
                reply.add(event)
            return json_response(final(True), headers=headers)
        response = web.StreamResponse(status=200, headers={"Content-Type": NDJSON, "Cache-Control": "no-cache",
                                                           "X-Accel-Buffering": "no", **headers})
        await response.prepare(request)

        async def send() -> None:
            async for event in result.events():
                data = b"".join(lines(reply.add(event)))
                if data:
                    await response.write(data)
            await response.write(b"".join(lines([final(False)])))
            await response.write_eof()

        async def fail(error: ErrorReply) -> None:
            await response.write(b"".join(lines([error.ollama_body()])))
            await response.write_eof()

        await streamed(request, send(), fail)
        return response


def lines(objects: list[dict]) -> list[bytes]:
    return [orjson.dumps(obj) + b"\n" for obj in objects]


async def tags(request: web.Request) -> web.Response:
    return json_response({"models": [model_entry(request.app[STATE])]})


async def running(request: web.Request) -> web.Response:
    return json_response({"models": [model_entry(request.app[STATE], running=True)]})


async def show(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body, _ = await read_json(request)
    check_model(state, parse_model(body))
    return json_response(model_show(state))


async def version(request: web.Request) -> web.Response:
    return json_response({"version": __version__})


async def embed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body, _ = await read_json(request)
    model, texts, dimensions = parse_embed(body, key="input")
    check_model(state, model)
    started = time.perf_counter()
    vectors, usage = await state.service.embed(texts, dimensions, tenant_of(request))
    return json_response({"model": reply_name(state, body), "embeddings": vectors.tolist(),
                          "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
                          "prompt_eval_count": usage.prompt_tokens})


async def embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body, _ = await read_json(request)
    model, texts, dimensions = parse_embed(body, key="prompt")
    check_model(state, model)
    vectors, _ = await state.service.embed(texts, dimensions, tenant_of(request))
    return json_response({"embedding": vectors[0].tolist()})


def setup_ollama_routes(app: web.Application) -> None:
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", running)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
