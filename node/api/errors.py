"""Failures in OpenAI's (and Ollama's) words: the one mapping from a typed error to an HTTP answer.

`error_reply(exc)` is the only place a failure becomes a status and an error object
`{"error": {"message", "type", "code", "param"}}`; under /api/ (Ollama's API) the same reply
is written in Ollama's envelope, `{"error": "<message>"}`, with the same status. Two writers use it: `error_middleware`,
for every failure of a handler before a response started, and the SSE error event of a
stream that already has its 200 (node/api/sse.py). Types are mapped, never messages:
the serving layer's errors (node/serving/errors.py) and the Batch API's
(node/batches/errors.py), sessions' and warm-ahead's own failures, aiohttp's HTTP exceptions (unknown path, wrong method, body over the size
limit) and the failures only HTTP knows (`Unauthorized`, `PayloadTooLarge`). Anything else is logged with
its traceback and answered 500; the server keeps serving.

The same reply is written in the envelope of the API a route belongs to: Anthropic's Messages
routes (`/v1/messages*`) answer `{"type": "error", "error": {"type", "message"}}` with Anthropic's
error types (`anthropic_body`); every other route answers OpenAI's object.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

from node.batches.errors import FileTooLarge, StorageFull, TooManyFiles
from node.serving.errors import (
    GenerationFailed, InvalidRequest, NotFound, Overloaded, ServingError,
)
from node.sessions.store import SessionNotFound, SessionsUnavailable, TooManySessions
from node.sessions.warm import WarmFailed
from shared.text import clip

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNEXPECTED = "The server failed to process the request"
OLLAMA_PREFIX = "/api/"


class Unauthorized(ServingError):
    """No or a wrong Bearer key (401)."""

    default_code = "invalid_api_key"


class PayloadTooLarge(ServingError):
    """A declared body over `[server] max_request_size_mb` (413), refused before it is read."""

    default_code = "request_too_large"


@dataclass(frozen=True, slots=True)
class ErrorReply:
    status: int
    type: str
    code: str | None
    message: str
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    unexpected: bool = False  # not a typed failure: the caller logs its traceback

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def ollama_body(self) -> dict[str, str]:
        """Ollama's error object: the message only."""
        return {"error": self.message}

    def anthropic_body(self) -> dict[str, object]:
        """The reply in Anthropic's envelope; its error type follows from the status. The envelope
        has no `param`: the message names the field (`param: message`, as Anthropic's do) when it
        does not already."""
        kind = ANTHROPIC_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        message = self.message
        if self.param and f"'{self.param}'" not in message:
            message = f"{self.param}: {message}"
        return {"type": "error", "error": {"type": kind, "message": message}}


# HTTP status -> Anthropic's error type (other 4xx: invalid_request_error, other 5xx: api_error).
ANTHROPIC_TYPES: Mapping[int, str] = {
    401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error",
}
ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_route(request: web.Request | None) -> bool:
    """Whether the request is one of Anthropic's Messages routes (errors in Anthropic's envelope)."""
    return request is not None and (request.path == ANTHROPIC_PREFIX or
                                    request.path.startswith(ANTHROPIC_PREFIX + "/"))


# ServingError subclass -> (status, OpenAI error type); the most specific class wins.
STATUSES: Mapping[type[ServingError], tuple[int, str]] = {
    InvalidRequest: (400, "invalid_request_error"),
    Unauthorized: (401, "authentication_error"),
    PayloadTooLarge: (413, "invalid_request_error"),
    FileTooLarge: (413, "invalid_request_error"),
    StorageFull: (507, "server_error"),
    TooManyFiles: (429, "rate_limit_error"),
    NotFound: (404, "invalid_request_error"),
    Overloaded: (503, "server_error"),
    GenerationFailed: (500, "server_error"),
    ServingError: (500, "server_error"),
}


def error_reply(exc: BaseException, request: web.Request | None = None, *,
                unexpected: str = UNEXPECTED) -> ErrorReply:
    """The status, type, code, message (and headers) a client gets for `exc`."""
    if isinstance(exc, ServingError):
        status, kind = next(STATUSES[cls] for cls in type(exc).__mro__ if cls in STATUSES)
        headers: dict[str, str] = {}
        if isinstance(exc, Overloaded):
            headers["Retry-After"] = str(exc.retry_after_s)
        elif isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = "Bearer"
        return ErrorReply(status, kind, exc.code, exc.message, exc.param, headers)
    if isinstance(exc, SessionNotFound):
        return ErrorReply(404, "invalid_request_error", "session_not_found", str(exc), "session")
    if isinstance(exc, TooManySessions):
        return ErrorReply(429, "rate_limit_error", "too_many_sessions", str(exc), "session")
    if isinstance(exc, SessionsUnavailable):
        return ErrorReply(503, "server_error", "sessions_unavailable", str(exc), "session",
                          headers={"Retry-After": "1"})
    if isinstance(exc, WarmFailed):
        return ErrorReply(503, "server_error", "overloaded", str(exc), headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        return _http_reply(exc, request)
    return ErrorReply(500, "server_error", "internal_error", unexpected, unexpected=True)


def _http_reply(exc: web.HTTPException, request: web.Request | None) -> ErrorReply:
    """aiohttp raised it (routing, body size): the same failure in OpenAI's words."""
    method, path = (request.method, request.path) if request is not None else ("?", "?")
    if isinstance(exc, web.HTTPNotFound):
        return ErrorReply(404, "invalid_request_error", "not_found", f"Unknown path: {method} {clip(path)}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return ErrorReply(405, "invalid_request_error", "method_not_allowed",
                          f"Method {method} is not allowed on {clip(path)}; use {allowed}", headers={"Allow": allowed})
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return ErrorReply(413, "invalid_request_error", "request_too_large",
                          exc.text or "Request body is larger than the limit")
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return ErrorReply(exc.status, kind, None, exc.reason or "HTTP error")


def speaks_ollama(path: str) -> bool:
    """Ollama's API (node/api/ollama_routes.py) lives under /api/ and answers in its envelope."""
    return path.startswith(OLLAMA_PREFIX)


def error_response(reply: ErrorReply, request: web.Request | None = None) -> web.Response:
    """The error in the envelope of the API the path belongs to: Ollama's under /api/, Anthropic's
    under /v1/messages, else OpenAI's."""
    if request is not None and speaks_ollama(request.path):
        body: dict = reply.ollama_body()
    elif anthropic_route(request):
        body = reply.anthropic_body()
    else:
        body = reply.body()
    return web.Response(status=reply.status, body=orjson.dumps(body), content_type="application/json",
                        headers=dict(reply.headers))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turns every failure of a handler into one OpenAI error response."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(error_reply(exc, request), request)
    except Exception as exc:
        reply = error_reply(exc, request)
        if reply.unexpected:
            log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(reply, request)
