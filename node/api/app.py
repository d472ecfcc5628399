"""The node's aiohttp application factory: middlewares, routes and resources.

`create_app(settings, *, engine=None, archive=None)` builds the app; the engine and the
archive are opened by a cleanup context when the app starts (unless given, in which case
the caller owns and closes them, and the prefix cache an engine was built with). When the
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
order: batch lines in flight (left unfinished for the next start), sampler, pending writes,
batch store, mirror, fleet pushes, engine, cache, archive.
Ollama's API (node/api/ollama_routes.py) is set up beside OpenAI's, under /api/.
Middlewares, outermost first: metrics (route, status,
latency), CORS (when `[server] enable_cors`), the error envelope, the body limit (a declared
Content-Length over it is a 413 before any body is read), auth (the Bearer key; on Anthropic's
Messages routes `x-api-key` too). Anthropic's Messages API and OpenAI's Responses API have routes of
their own (node/api/anthropic_routes.py, node/api/responses_routes.py) over the same service.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
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
from node.api.state import SETTINGS, STATE, InFlightGate, NodeState
from node.archive.client import ArchiveClient, open_archive
from node.archive.mirror import CorpusMirror
from node.batches.runner import BatchRunner
from node.batches.store import BatchStore
from node.cache.fleet import FleetConfig, FleetTier
from node.cache.prefix_cache import PrefixCache
from node.config import NodeSettings
from node.serving.engine_client import EngineClient
from node.serving.metrics import CacheStats, KernelSeries, LiveStats, Metrics, SpeculationSeries
from node.serving.model import describe_model
from node.serving.savings import Savings, SavingsConfig
from node.serving.conclave.runner import ConclavePolicy
from node.serving.embeddings import EmbeddingLimits
from node.serving.service import CompletionService, ServiceOptions
from node.sessions.archived import ArchivedSessionStore
from node.sessions.store import SessionLimits, Sessions, SessionStore
from node.speculative.controller import Controller
from node.speculative.palimpsest import Palimpsest

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


def auth_middleware(api_key: str) -> Middleware:
    """The key as a Bearer token; on Anthropic's Messages routes also as `x-api-key` (its clients' header)."""
    expected = f"Bearer {api_key}".encode()
    bare = api_key.encode()

    def header(request: web.Request, name: str) -> bytes:
        try:
            return request.headers.get(name, "").encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 can never be the key
            return b""

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in PUBLIC_PATHS or path in PAGE_PATHS or path.startswith("/static/"):
            return await handler(request)
        for name in ("Authorization", "x-api-key"):
            if len(request.headers.getall(name, ())) > 1:  # which one counts is a guess: refuse both
                raise InvalidRequest(f"Send one '{name}' header, not several", code="duplicate_header", param=name)
        if hmac.compare_digest(header(request, "Authorization"), expected):
            return await handler(request)
        if anthropic_route(request):
            if hmac.compare_digest(header(request, "x-api-key"), bare):
                return await handler(request)
            raise Unauthorized("Missing or wrong API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'")
        raise Unauthorized("Missing or wrong API key: send 'Authorization: Bearer <key>'")

    return check_key


def create_app(settings: NodeSettings, *, engine: EngineClient | None = None,
               archive: ArchiveClient | None = None) -> web.Application:
    server = settings.server
    middlewares: list[Middleware] = [metrics_middleware]
    if server.enable_cors:
        middlewares.append(cors_middleware)
    middlewares.append(error_middleware)
    middlewares.append(body_limit_middleware(server.max_request_size_mb * MIB, settings.batch.max_file_mb * MIB))
    if server.api_key:
        middlewares.append(auth_middleware(server.api_key))
    app = web.Application(client_max_size=server.max_request_size_mb * MIB, middlewares=middlewares)
    app[SETTINGS] = settings
    app.cleanup_ctx.append(partial(node_resources, engine=engine, archive=archive))
    setup_routes(app)
    setup_cache_routes(app)
    setup_batch_routes(app)
    setup_embedding_routes(app)
    setup_ollama_routes(app)
    setup_anthropic_routes(app)
    setup_responses_routes(app)
    return app


async def node_resources(app: web.Application, *, engine: EngineClient | None,
                         archive: ArchiveClient | None) -> AsyncIterator[None]:
    """Open what the node needs (engine, archive), publish its state, close it at the end."""
    settings = app[SETTINGS]
    loop = asyncio.get_running_loop()
    own_engine, own_archive = engine is None, archive is None
    fleet: FleetTier | None = None
    mirror: CorpusMirror | None = None
    batches: BatchRunner | None = None
    sampler: asyncio.Task[None] | None = None
    if engine is None:
        from node.assembly import open_engine

        opened = await loop.run_in_executor(None, open_engine, settings)
        engine = opened
    hook = engine.config.prefix_cache  # the node's prefix cache, when the engine was built with one
    cache = hook if isinstance(hook, PrefixCache) else None
    try:
        if archive is None:
            archive = await loop.run_in_executor(None, open_archive, settings)
            await archive.start()
        model = await loop.run_in_executor(None, describe_model, engine, settings)
        metrics = Metrics()
        metrics.watch(LiveStats(engine.stats, partial(_errors, archive), archive.state))
        metrics.watch(KernelSeries(engine.kernel_report, partial(cost_line_ms, engine)))
        if cache is not None:
            remote = archive.state() != "embedded"
            fleet = FleetTier(cache, archive, FleetConfig(push=remote, fetch=remote))
            metrics.watch(CacheStats(cache.stats))
        speculator = engine.config.speculator
        controller = speculator if isinstance(speculator, Controller) else None
        if controller is not None:
            metrics.watch(SpeculationSeries(controller.stats.snapshot))
            mirror = await start_mirror(settings, archive, model.fingerprint, controller)
        sessions = await open_sessions(settings, archive)
        service = CompletionService(engine, archive, model, metrics, ServiceOptions(
            observe=settings.arca.observe, observe_prompt_tokens=settings.arca.observe_prompt_tokens,
            l1_ttl_s=settings.arca.l1_ttl_s or None, conclave=ConclavePolicy.from_settings(settings.conclave),
            embeddings=EmbeddingLimits(settings.embeddings.max_inputs, settings.embeddings.max_request_tokens),
            max_queue_wait_s=settings.server.max_queue_wait_s),
            cache=cache, fleet=fleet, sessions=sessions)
        warm_grammars = getattr(engine, "warm_grammars", None)
        if warm_grammars is not None:  # the grammar engine's vocabulary, built before the first structured request
            loop.run_in_executor(None, warm_grammars)
        gate = InFlightGate(settings.server.max_concurrent_requests)
        savings = Savings(service.ledger, engine.stats, config=SavingsConfig(
            settings.stats.window_minutes, settings.stats.sample_seconds, settings.stats.log_minutes),
            drafts=partial(_accepted_drafts, controller) if controller is not None else None,
            plain_rate=controller.costs.plain_rate if controller is not None else None)
        sampler = asyncio.create_task(savings.run(), name="reame-savings")
        state = NodeState(settings, engine, archive, model, metrics, service, gate, time.time(), savings, controller)
        if settings.batch.enabled:
            batches = await start_batches(settings, state, engine)
        app[STATE] = replace(state, batches=batches)
        yield
        if batches is not None:
            await batches.close()
        await service.drain()
        service.grammar_workers.close()
    finally:
        if sampler is not None:
            sampler.cancel()
        if batches is not None:
            await loop.run_in_executor(None, batches.store.close)
        if mirror is not None:
            await mirror.close()
        if fleet is not None:
            await fleet.close()
        if own_engine:
            await loop.run_in_executor(None, engine.close)
            if cache is not None:
                await loop.run_in_executor(None, cache.close)
        if own_archive and archive is not None:
            await archive.close()


async def open_sessions(settings: NodeSettings, archive: ArchiveClient) -> Sessions:
    """Sessions in the remote archive (any node continues any session), else under <home>/sessions."""
    limits = SessionLimits(max_sessions=settings.server.max_sessions,
                           max_per_owner=settings.server.max_sessions_per_client)
    if archive.state() != "embedded":
        return ArchivedSessionStore(archive, limits)
    return await asyncio.get_running_loop().run_in_executor(None, SessionStore.open, settings.home / "sessions",
                                                            limits)


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


def _accepted_drafts(controller: Controller) -> dict[str, int]:
    return {name: stats.accepted for name, stats in list(controller.stats.sources.items())}


async def start_mirror(settings: NodeSettings, archive: ArchiveClient, fingerprint: str,
                       controller: Controller) -> CorpusMirror | None:
    """Feed the archive draft source from the corpus: the fleet's (remote, with a local copy) or
    this node's own (embedded)."""
    palimpsest = controller.source("archive")
    if not isinstance(palimpsest, Palimpsest):
        return None
    remote = archive.state() != "embedded"
    # The local copy's cursor counts the streams of one server (an ARCA's ids, a Redis stream's
    # entry ids): each server the corpus comes from has a copy of its own.
    source = hashlib.blake2b(str(getattr(archive, "corpus_name", "")).encode(), digest_size=6).hexdigest()
    path = settings.home / "mirror" / f"{fingerprint}.{source}.l4" if remote else None
    legacy = settings.home / "mirror" / f"{fingerprint}.l4"  # one copy for the one ARCA, before
    if path is not None and archive.kind == "arca" and legacy.exists() and not path.exists():
        legacy.replace(path)
    mirror = CorpusMirror(archive, fingerprint.encode(), palimpsest.add, path=path,
                          max_tokens=palimpsest.max_tokens)
    await mirror.start()
    return mirror


def _errors(archive: ArchiveClient) -> dict[str, int]:
    return archive.counters.errors
