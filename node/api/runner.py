"""Serving a node: open everything, listen, log how to call it, stop cleanly on a signal.

`run_node(settings) -> int` is what `reame run MODEL --serve` calls. Handlers are cancelled
when their client disconnects (`handler_cancellation`), which is how a non-streamed
generation stops within one engine step once nobody waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from types import TracebackType
from typing import Any, Callable, Coroutine

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from node.api.app import create_app
from node.api.routes import cost_line_ms
from node.api.state import STATE
from shared.text import redact_url
from node.config import NodeSettings
from node.engine.kernels import describe as describe_kernels

log = logging.getLogger(__name__)
# What logging accepts as exc_info (typeshed's private _ExcInfoType).
ExcInfo = bool | BaseException | tuple[type[BaseException], BaseException, TracebackType | None] \
    | tuple[None, None, None] | None


class HttpServerLog(logging.LoggerAdapter):
    """aiohttp's server log, where a malformed request (bad request line, header or framing:
    the client's fault) is one WARNING line instead of an ERROR with a traceback."""

    def exception(self, msg: object, *args: object, exc_info: ExcInfo = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError) and 400 <= (exc_info.code or 500) < 500:
            peer = args[0] if args else "a client"
            detail = (exc_info.message or type(exc_info).__name__).splitlines()[0][:200]
            self.warning("malformed HTTP request from %s: %s %s", peer, exc_info.code, detail)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start `app` on host:port (0 = any free port); returns the runner and the bound port."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0,
                           logger=HttpServerLog(logging.getLogger("node.api.http"), {}))
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return runner, (addresses[0][1] if addresses else port)


def how_to_call(host: str, port: int, model_id: str, api_key: str | None) -> str:
    auth = ' -H "Authorization: Bearer $REAME_API_KEY"' if api_key else ""
    base = f"http://{host}:{port}"
    return (
        f"node serving {model_id} on {base} (chat page: {base}/)\n"
        f"  curl {base}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\\n"
        f"       -d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'\n"
        f"  OpenAI clients: base_url={base}/v1; Anthropic clients: base_url={base}"
    )


async def serve(settings: NodeSettings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    server = settings.server
    try:
        runner, port = await start_site(create_app(settings), server.host, server.port)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", server.host, server.port, exc)
        return 1
    state = runner.app[STATE]
    log.info("archive: %s", "remote ARCA " + redact_url(settings.arca.remote) if settings.arca.remote else "embedded")
    log.info("kernels: %s", describe_kernels(state.engine.kernel_report(), cost_line_ms(state.engine)))
    log.info(how_to_call(server.host, port, state.model.model_id, next(iter(server.keys), None)))
    await stop.wait()
    log.info("shutting down: finishing in-flight requests")
    await runner.cleanup()
    return 0


def run_node(settings: NodeSettings) -> int:
    """Serve until SIGINT/SIGTERM; the exit code says whether the node could start."""
    run: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    try:
        return run(serve(settings))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # model or archive failing to open: one clear line, no trace
        log.error("node failed to start: %s", exc)
        log.debug("start-up failure", exc_info=True)
        return 1
