"""The node's aiohttp application factory: middlewares, routes and resources.

`create_app(settings, *, node=None, engine=None, archive=None)` builds the app; the node
(node/assembly.py: engine, archive, caches, service) is opened by a cleanup context when the
app starts (unless given, in which case the caller owns and closes it; a given engine or
archive likewise stays the caller's, with the prefix cache an engine was built with). When the
engine has a prefix cache, a fleet tier (node/cache/fleet.py) is put in front of it: with a
remote ARCA it fetches and pushes states through ARCA's L3; with the embedded archive it
only preloads disk states into RAM (L3 in the embedded archive would be a second copy of
the node's own disk tier on the same disk). Sessions live in the remote archive when there is
one (node/sessions/archived.py), else under `<home>/sessions`.
With speculation on, the archive draft source (the Palimpsest) is fed by an L4 mirror
(node/archive/mirror.py) of the model's corpus; with a remote ARCA it keeps a local copy
under `<home>/mirror` (one per server the corpus comes from). The Batch API (node/batches) keeps its store under `[batch] directory`
and runs its lines through the same service at batch priority; the savings sampler
(node/serving/savings.py) feeds /v1/reame/stats and the periodic savings log line. Shutdown
order: batch lines in flight (left unfinished for the next start), batch store, then the node:
sampler, the pending archive writes and prefix states, flushed within `[server]
shutdown_flush_s` (node/serving/flush.py), mirror, fleet tier, engine, cache, archive.
Ollama's API (node/api/ollama_routes.py) is set up beside OpenAI's, under /api/.
Middlewares, outermost first: metrics (route, status,
latency), CORS (when `[server] enable_cors`), the error envelope, the body limit (a declared
Content-Length over it is a 413 before any body is read), auth (the Bearer key; on Anthropic's
Messages routes `x-api-key` too). Anthropic's Messages API and OpenAI's Responses API have routes of
their own (node/api/anthropic_routes.py, node/api/responses_routes.py) over the same service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from functools import partial
from typing import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Middleware

from node.api.batch_lines import ApiLines
from node.api.batch_routes import setup_batch_routes
from node.api.cache_routes import setup_cache_routes
from node.api.anthropic_routes import setup_anthropic_routes
from node.api.embedding_routes import setup_embedding_routes
from node.api.errors import Handler, PayloadTooLarge, Unauthorized, anthropic_route, error_middleware
from node.api.ollama_routes import setup_ollama_routes
from node.api.responses_routes import setup_responses_routes
from node.api.routes import cost_line_ms, setup_routes
from node.serving.errors import InvalidRequest
from node.api.state import SETTINGS, STATE, TENANT, TRUSTED, NodeState
from node.archive.client import ArchiveClient
from node.assembly import Node
from node.batches.runner import BatchRunner
from node.batches.store import BatchStore
from node.config import NodeSettings
from node.serving.engine_client import EngineClient
from node.serving.metrics import KernelSeries
from node.serving.tenants import ApiKeys

log = logging.getLogger(__name__)
MIB = 1024 * 1024
PUBLIC_PATHS = ("/health",)
UPLOAD_PATH = "/v1/files"
PAGE_PATHS = ("/", "/favicon.ico")  # the chat page holds no data; its API calls carry the key
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Reame-Session, x-api-key, anthropic-version",
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Expose-Headers": "X-Reame-Cache, X-Reame-Session",
}


def route_label(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = 499  # the client went away (nginx's convention)
        raise
    finally:
        state = request.app.get(STATE)
        if state is not None:
            label = route_label(request)
            state.metrics.requests.labels(label, str(status)).inc()
            state.metrics.latency.labels(label).observe(time.perf_counter() - started)


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return web.Response(status=204, headers=CORS_HEADERS)
    response = await handler(request)
    if not response.prepared:
        response.headers.update(CORS_HEADERS)
    return response


def body_limit_middleware(limit: int, upload_limit: int) -> Middleware:
    """A declared Content-Length over the limit is refused at once, before any body is read
    (aiohttp alone would wait for the body and refuse it only after `limit` bytes). File
    uploads (`POST /v1/files`) have `[batch] max_file_mb` instead, plus room for the form."""

    @web.middleware
    async def check_length(request: web.Request, handler: Handler) -> web.StreamResponse:
        declared = request.content_length
        upload = request.method == "POST" and request.path == UPLOAD_PATH
        allowed, setting = (upload_limit + MIB, "[batch] max_file_mb") if upload else \
            (limit, "[server] max_request_size_mb")
        if declared is not None and declared > allowed:
            raise PayloadTooLarge(f"Request body of {declared} bytes is over the limit of {allowed} bytes "
                                  f"({setting})")
        return await handler(request)

    return check_length


def auth_middleware(keys: ApiKeys) -> Middleware:
    """A key as a Bearer token; on Anthropic's Messages routes also as `x-api-key` (its clients'
    header). The key found names the request's tenant (node/serving/tenants.py). `/health`, the
    chat page and its static files answer without a key (`/health` then says only its status)."""

    def header(request: web.Request, name: str) -> bytes:
        try:
            return request.headers.get(name, "").encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 can never be the key
            return b""

    def bearer(request: web.Request) -> str | None:
        value = header(request, "Authorization")
        return keys.tenant_of(value[7:]) if value.startswith(b"Bearer ") else None

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        public = path in PUBLIC_PATHS or path in PAGE_PATHS or path.startswith("/static/")
        tenant = None
        duplicated = [name for name in ("Authorization", "x-api-key") if len(request.headers.getall(name, ())) > 1]
        if duplicated and not public:  # which one counts is a guess: refuse both
            raise InvalidRequest(f"Send one '{duplicated[0]}' header, not several", code="duplicate_header",
                                 param=duplicated[0])
        if not duplicated:
            tenant = bearer(request)
            if tenant is None and anthropic_route(request):
                tenant = keys.tenant_of(header(request, "x-api-key"))
        request[TRUSTED] = tenant is not None
        if tenant is not None:
            request[TENANT] = tenant
            return await handler(request)
        if public:
            return await handler(request)
        if anthropic_route(request):
            raise Unauthorized("Missing or wrong API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'")
        raise Unauthorized("Missing or wrong API key: send 'Authorization: Bearer <key>'")

    return check_key


def create_app(settings: NodeSettings, *, node: Node | None = None, engine: EngineClient | None = None,
               archive: ArchiveClient | None = None) -> web.Application:
    server = settings.server
    middlewares: list[Middleware] = [metrics_middleware]
    if server.enable_cors:
        middlewares.append(cors_middleware)
    middlewares.append(error_middleware)
    middlewares.append(body_limit_middleware(server.max_request_size_mb * MIB, settings.batch.max_file_mb * MIB))
    keys = ApiKeys.of(server.keys)
    if keys:
        middlewares.append(auth_middleware(keys))
    app = web.Application(client_max_size=server.max_request_size_mb * MIB, middlewares=middlewares)
    app[SETTINGS] = settings
    app.cleanup_ctx.append(partial(node_resources, node=node, engine=engine, archive=archive))
    setup_routes(app)
    setup_cache_routes(app)
    setup_batch_routes(app)
    setup_embedding_routes(app)
    setup_ollama_routes(app)
    setup_anthropic_routes(app)
    setup_responses_routes(app)
    return app


async def node_resources(app: web.Application, *, node: Node | None, engine: EngineClient | None,
                         archive: ArchiveClient | None) -> AsyncIterator[None]:
    """Open the node (node/assembly.py) unless one is given, publish its state, close it at the end."""
    async with contextlib.AsyncExitStack() as stack:
        if node is None:
            node = await stack.enter_async_context(Node.open(app[SETTINGS], engine=engine, archive=archive))
        async for _ in serve_node(app, node):
            yield


async def serve_node(app: web.Application, node: Node) -> AsyncIterator[None]:
    """The app's part of an open node: /metrics' kernel series, the in-flight gate, the Batch API."""
    settings = node.settings
    node.metrics.watch(KernelSeries(node.engine.kernel_report, partial(cost_line_ms, node.engine)))
    state = NodeState.of(node)
    batches: BatchRunner | None = None
    try:
        if settings.batch.enabled:
            batches = await start_batches(settings, state, node.engine)
        app[STATE] = replace(state, batches=batches)
        yield
        if batches is not None:
            await batches.close()
    finally:
        if batches is not None:
            await asyncio.get_running_loop().run_in_executor(None, batches.store.close)


async def start_batches(settings: NodeSettings, state: NodeState, engine: EngineClient) -> BatchRunner:
    """The Batch API's store and runner; lines run through this node's own parser and service."""
    batch = settings.batch
    store = await asyncio.get_running_loop().run_in_executor(None, partial(
        BatchStore.open, batch.directory, max_file_bytes=batch.max_file_mb * MIB,
        max_storage_bytes=batch.max_storage_mb * MIB, max_files_per_owner=batch.max_files_per_client))
    slots = int(engine.stats().get("slots_total", 0) or 0) or settings.server.parallel or 1
    concurrency = batch.concurrency or max(1, slots - batch.interactive_slots)
    runner = BatchRunner(store, ApiLines(state), concurrency=concurrency, max_lines=batch.max_lines)
    runner.start()
    return runner
