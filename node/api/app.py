"""The node's aiohttp application factory: middlewares, routes and resources.

`create_app(settings, *, engine=None, archive=None)` builds the app; the engine and the
archive are opened by a cleanup context when the app starts (unless given, in which case
the caller owns and closes them, and the prefix cache an engine was built with). When the
engine has a prefix cache, a fleet tier (node/cache/fleet.py) is put in front of it: with a
remote ARCA it fetches and pushes states through ARCA's L3; with the embedded archive it
only preloads disk states into RAM (L3 in the embedded archive would be a second copy of
the node's own disk tier on the same disk). Sessions live under `<home>/sessions`.
Shutdown order: pending writes, fleet pushes, engine, cache, archive.
Middlewares, outermost first: metrics (route, status,
latency), CORS (when `[server] enable_cors`), the error envelope, the body limit (a declared
Content-Length over it is a 413 before any body is read), Bearer auth.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from functools import partial
from typing import Any, AsyncIterator

from aiohttp import web

from node.api.errors import Handler, PayloadTooLarge, Unauthorized, error_middleware
from node.api.metrics import CacheStats, LiveStats, Metrics
from node.api.cache_routes import setup_cache_routes
from node.api.routes import setup_routes
from node.api.state import SETTINGS, STATE, InFlightGate, NodeState
from node.archive_client import ArchiveClient, RemoteArchive, open_archive
from node.cache.fleet import FleetConfig, FleetTier
from node.served_model import describe_model
from node.sessions import SessionStore
from node.service import CompletionService, ServiceOptions

log = logging.getLogger(__name__)
MIB = 1024 * 1024
PUBLIC_PATHS = ("/health",)
PAGE_PATHS = ("/", "/favicon.ico")  # the chat page holds no data; its API calls carry the key
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Reame-Session",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
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


def body_limit_middleware(limit: int):
    """A declared Content-Length over the limit is refused at once, before any body is read
    (aiohttp alone would wait for the body and refuse it only after `limit` bytes)."""

    @web.middleware
    async def check_length(request: web.Request, handler: Handler) -> web.StreamResponse:
        declared = request.content_length
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"Request body of {declared} bytes is over the limit of {limit} bytes "
                                  f"([server] max_request_size_mb)")
        return await handler(request)

    return check_length


def auth_middleware(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in PUBLIC_PATHS or path in PAGE_PATHS or path.startswith("/static/"):
            return await handler(request)
        try:
            given = request.headers.get("Authorization", "").encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 can never be the key
            given = b""
        if not hmac.compare_digest(given, expected):
            raise Unauthorized("Missing or wrong API key: send 'Authorization: Bearer <key>'",
                               headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check_key


def create_app(settings: Any, *, engine: Any = None, archive: ArchiveClient | None = None) -> web.Application:
    server = settings.server
    middlewares = [metrics_middleware]
    if server.enable_cors:
        middlewares.append(cors_middleware)
    middlewares.append(error_middleware)
    middlewares.append(body_limit_middleware(server.max_request_size_mb * MIB))
    if server.api_key:
        middlewares.append(auth_middleware(server.api_key))
    app = web.Application(client_max_size=server.max_request_size_mb * MIB, middlewares=middlewares)
    app[SETTINGS] = settings
    app.cleanup_ctx.append(partial(node_resources, engine=engine, archive=archive))
    setup_routes(app)
    setup_cache_routes(app)
    return app


async def node_resources(app: web.Application, *, engine: Any, archive: ArchiveClient | None) -> AsyncIterator[None]:
    """Open what the node needs (engine, archive), publish its state, close it at the end."""
    settings = app[SETTINGS]
    loop = asyncio.get_running_loop()
    own_engine, own_archive = engine is None, archive is None
    cache = fleet = service = None
    if own_engine:
        from node.engine.loader import open_engine

        engine = await loop.run_in_executor(None, open_engine, settings)
    cache = getattr(engine.config, "prefix_cache", None)
    try:
        if own_archive:
            archive = await loop.run_in_executor(None, open_archive, settings)
            if isinstance(archive, RemoteArchive):
                await archive.start()
        model = await loop.run_in_executor(None, describe_model, engine, settings)
        metrics = Metrics()
        metrics.watch(LiveStats(engine.stats, lambda: archive.counters.errors, archive.state))
        if cache is not None:
            remote = archive.state() != "embedded"
            fleet = FleetTier(cache, archive, FleetConfig(push=remote, fetch=remote))
            metrics.watch(CacheStats(cache.stats))
        sessions = await loop.run_in_executor(None, SessionStore.open, settings.home / "sessions")
        service = CompletionService(engine, archive, model, metrics, ServiceOptions(
            observe=settings.arca.observe, observe_prompt_tokens=settings.arca.observe_prompt_tokens),
            cache=cache, fleet=fleet, sessions=sessions)
        gate = InFlightGate(settings.server.max_concurrent_requests)
        app[STATE] = NodeState(settings, engine, archive, model, metrics, service, gate, time.time())
        yield
        await service.drain()
    finally:
        if fleet is not None:
            await fleet.close()
        if own_engine:
            await loop.run_in_executor(None, engine.close)
            if cache is not None:
                await loop.run_in_executor(None, cache.close)
        if own_archive and archive is not None:
            await archive.close()
