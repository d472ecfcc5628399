"""The node's HTTP routes: OpenAI completions and chat, models, health, metrics, savings, the web page.

Handlers parse and validate into frozen requests (node.api.schemas), ask the service for an
answer and shape it (node.api.shapes), as one JSON body or as SSE chunks. Every response
to a generation request carries `X-Reame-Cache: hit | miss | bypass` (bypass: the request
is not deterministic, so the archive was not asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, TypeVar

import orjson
from aiohttp import web

from node import __version__
from node.api import openapi
from node.api.schemas import parse_chat, parse_completion
from node.api.shapes import ChunkMaker, Collector, Identity, tool_readers
from node.api.sse import DONE_FRAME, data_frames, openai_error_frame, stream_frames
from node.api.state import STATE, NodeState, tenant_of, trusted
from node.serving.engine_client import EngineClient
from node.serving.errors import InvalidRequest, ModelNotFound, NotFound, Overloaded
from shared.text import clip
from node.serving.metrics import CONTENT_TYPE
from node.serving.answer import Answer
from node.serving.requests import ChatRequest
from node.serving.service import Plan
from node.sessions.turns import history_calls
from node.speculative.controller import Controller

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).parent / "static"
SESSION_HEADER = "X-Reame-Session"
OFF_LOOP_BYTES = 32 * 1024  # bodies this large are tokenized on a worker thread
ChatParser = Callable[[Any, Mapping[str, str] | None], ChatRequest]  # body, earlier calls' ids -> request
T = TypeVar("T")
R = TypeVar("R")


def json_response(payload: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json",
                        headers=headers)


async def read_json(request: web.Request) -> tuple[object, int]:
    """The parsed body and its size in bytes."""
    raw = await request.read()  # over client_max_size: aiohttp raises 413, mapped by the middleware
    if not raw:
        raise InvalidRequest("The request body is empty; send a JSON object", code="invalid_json")
    try:
        return orjson.loads(raw), len(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}", code="invalid_json") from None


async def make_plan(planner: Callable[[T], R], req: T, body_size: int) -> R:
    """Render and tokenize; a large prompt is tokenized off the event loop."""
    if body_size < OFF_LOOP_BYTES:
        return planner(req)
    return await asyncio.get_running_loop().run_in_executor(None, planner, req)


def check_model(state: NodeState, name: str | None) -> None:
    if not state.model.accepts(name):
        raise ModelNotFound(f"The model '{clip(name or '')}' does not exist; this node serves '{state.model.model_id}'",
                            param="model")


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body, size = await read_json(request)
    req = parse_completion(body)
    check_model(state, req.model)
    await state.service.verify(req.options)
    planner = partial(state.service.plan_completion, tenant=tenant_of(request))
    return await answer(request, state, await make_plan(planner, req, size))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body, size = await read_json(request)
    async with chat_turn(request, state, body, parse_chat) as (req, planner, headers):
        return await answer(request, state, await make_plan(planner, req, size), headers)


@contextlib.asynccontextmanager
async def chat_turn(request: web.Request, state: NodeState, body: object, parse: ChatParser,
                    ) -> AsyncIterator[tuple[ChatRequest, Callable[[ChatRequest], Plan], dict[str, str]]]:
    """A chat request parsed, its model checked, its schemas verified, the planner that answers it and the response
    headers; inside a session (the `session` field or X-Reame-Session) the session's lock is
    held until the caller has answered, so each turn continues the last."""
    session_id = session_of(request, body)
    if session_id is None:
        req = parse(body, None)
        check_model(state, req.model)
        await state.service.verify(req.options)
        yield req, partial(state.service.plan_chat, tenant=tenant_of(request)), {}
        return
    turns = state.service.turns
    if turns is None:
        raise InvalidRequest("Sessions are not enabled on this node", param="session")
    async with turns.store.lock(session_id):
        session = await turns.store.get(session_id)
        req = parse(body, history_calls(session.messages))  # tool results may answer the history's calls
        check_model(state, req.model)
        await state.service.verify(req.options)
        yield req, partial(state.service.plan_chat, session=session, tenant=tenant_of(request)), \
            {SESSION_HEADER: session_id}


def session_of(request: web.Request, body: object) -> str | None:
    """The session a chat request continues: the `session` field, else the X-Reame-Session header."""
    value = body.get("session") if isinstance(body, dict) else None
    if value is None:
        value = request.headers.get(SESSION_HEADER)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("'session' must be a string (an id from POST /v1/sessions)", param="session")
    return value or None


async def answer(request: web.Request, state: NodeState, plan: Plan,
                 extra_headers: dict[str, str] | None = None) -> web.StreamResponse:
    async with answering(state, plan) as result:
        identity = Identity.new(plan.kind, state.model.model_id, state.model.system_fingerprint)
        n_choices = sum(job.n for job in plan.jobs)
        headers = {"X-Reame-Cache": result.cache, **(extra_headers or {})}
        if plan.options.stream:
            return await stream_answer(request, plan, result, identity, n_choices, headers)
        return json_response(await collect(plan, result, identity), headers=headers)


@contextlib.asynccontextmanager
async def answering(state: NodeState, plan: Plan) -> AsyncIterator[Answer]:
    """The plan's answer, within the node's in-flight limit (over it: 503)."""
    if not state.gate.try_enter():
        raise Overloaded(f"{state.gate.limit} requests are already in flight; retry shortly")
    try:
        async with state.service.answer(plan) as result:
            yield result
    finally:
        state.gate.leave()


async def collect(plan: Plan, result: Answer, identity: Identity) -> dict:
    """The whole OpenAI response object of a non-streamed answer."""
    n_choices = sum(job.n for job in plan.jobs)
    collector = Collector(identity, n_choices, plan.options.logprobs is not None, tool_readers(plan, n_choices))
    async for event in result.events():
        collector.add(event)
    return collector.response(plan.prompt_tokens)


async def stream_answer(request: web.Request, plan: Plan, result, identity: Identity, n_choices: int,
                        headers: dict) -> web.StreamResponse:
    maker = ChunkMaker(identity, plan.options.logprobs is not None, plan.options.include_usage,
                       tool_readers(plan, n_choices))

    async def frames() -> AsyncIterator[bytes]:
        if plan.kind == "chat":
            yield data_frames(maker.role(index) for index in range(n_choices))
        async for event in result.events():
            yield data_frames(maker.events(event))
        if plan.options.include_usage:
            yield data_frames([maker.usage_chunk(plan.prompt_tokens)])
        yield DONE_FRAME

    return await stream_frames(request, headers, frames(), openai_error_frame)


async def models(request: web.Request) -> web.Response:
    return json_response({"object": "list", "data": [model_card(request.app[STATE])]})


async def model_detail(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["model"]
    check_model(state, name)
    return json_response(model_card(state))


def model_card(state: NodeState) -> dict:
    return {"id": state.model.model_id, "object": "model", "created": int(state.started_at),
            "owned_by": "reame", "context_length": state.model.n_ctx, "fingerprint": state.model.fingerprint}


async def health(request: web.Request) -> web.Response:
    """The status alone to a caller without the key (a node with keys; what a load balancer
    needs), the node's details to one with it (and to everyone on a node without keys)."""
    state = request.app[STATE]
    if not trusted(request):
        return json_response({"status": "ok"})
    stats = state.engine.stats()
    return json_response({
        "status": "ok", "model": state.model.model_id, "archive": state.archive.state(),
        "archive_kind": getattr(state.archive, "kind", "unknown"),
        "engine": {key: value for key, value in stats.items() if isinstance(value, (int, float, str))},
        "cache": cache_health(state),
        "kernels": {**state.engine.kernel_report(), "step_cost_line_ms": cost_line_ms(state.engine)},
        "speculation": speculation_health(state),
        "time": time.time(),
    })


def cost_line_ms(engine: EngineClient) -> Mapping[str, float] | None:
    """The step cost line in ms: the speculation controller's calibrated one, else the kernel probe's."""
    speculator = engine.config.speculator
    if isinstance(speculator, Controller) and speculator.costs.measured:
        return speculator.costs.line().as_dict()
    line = engine.kernel_report().get("probe_line_ms")
    return line if isinstance(line, Mapping) else None


def speculation_health(state: NodeState) -> dict:
    controller = state.speculation
    if controller is None:
        return {"enabled": False}
    stats = controller.stats.snapshot()
    sources = {name: {**control, **{key: stats[name][key] for key in ("drafted", "accepted", "acceptance",
                                                                      "saved_seconds")}}
               for name, control in controller.state().items()}
    return {"enabled": True, "max_draft": controller.config.max_draft, "sources": sources,
            "planner": controller.planner_state(),
            "step_cost_scale": round(controller.costs.scale, 3),
            "step_cost_line_ms": {**controller.costs.line().as_dict(), "measured": controller.costs.measured,
                                  "calibrations": controller.costs.calibrations,
                                  "refits": controller.costs.refits,
                                  "sizes_off_the_line": {str(n): round(b, 3) for n, b in
                                                         sorted(controller.costs.bends.items()) if b != 1.0},
                                  "one_token_each_ms": {str(n): round(s * 1000, 2) for n, s in
                                                        sorted(controller.costs.spread.items())},
                                  "row_after_context_ms": {str(n): round(controller.costs.context_seconds(n) * 1000, 3)
                                                           for n in sorted(controller.costs.context)}}}


def cache_health(state: NodeState) -> dict:
    service = state.service
    cache = service.cache
    if cache is None:
        return {"enabled": False}
    stats = cache.stats()
    fleet = service.fleet
    keys = ("ram_entries", "ram_bytes", "disk_entries", "disk_bytes", "lookups", "tokens_restored",
            "tokens_prefilled", "fleet_hits", "fleet_errors")
    return {
        "enabled": True, "block_tokens": cache.chain.block_tokens,
        "disk": str(cache.config.directory) if cache.config.directory else None,
        "fleet": ("on" if fleet.config.fetch or fleet.config.push else "off") if fleet else "off",
        "hits": stats.get("ram_hits", 0) + stats.get("disk_hits", 0),
        "sessions": len(service.turns.store) if service.turns else 0,
        **{key: stats[key] for key in keys if key in stats},
    }


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not state.settings.server.enable_metrics:
        raise NotFound("Metrics are switched off on this node ([server] enable_metrics)")
    return web.Response(body=state.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def savings(request: web.Request) -> web.Response:
    """Tokens served against tokens computed, by tier, since start and recently (node/serving/savings.py)."""
    return json_response(request.app[STATE].savings.report())


async def openapi_description(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response(openapi.document(state.model.model_id, __version__,
                                         auth=bool(state.settings.server.keys)))


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model}", model_detail)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/reame/stats", savings)
    app.router.add_get("/openapi.json", openapi_description)
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR, show_index=False)
