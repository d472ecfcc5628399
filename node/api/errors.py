"""The node's HTTP error hierarchy and the one middleware that writes OpenAI's error envelope.

Handlers and the service raise typed `ApiError`s; aiohttp's own HTTP exceptions (unknown
path, wrong method, body over the size limit) and engine errors are mapped by type here.
Every error body has the shape `{"error": {"message", "type", "code", "param"}}`. An
unexpected exception is logged with its traceback and answered 500; the server keeps
serving.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import orjson
from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error with an HTTP status and the fields of OpenAI's error object."""

    status = 500
    error_type = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "code": self.code,
                "param": self.param,
            }
        }


class InvalidRequest(ApiError):
    """The request is malformed: wrong JSON, wrong type, value out of range (400)."""

    status = 400
    error_type = "invalid_request_error"


class UnsupportedFeature(InvalidRequest):
    """A real OpenAI feature this node does not offer (tools, images, ...) (400)."""

    default_code = "unsupported_feature"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class Unauthorized(ApiError):
    status = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class NotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class MethodNotAllowed(ApiError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class PayloadTooLarge(ApiError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class Overloaded(ApiError):
    """Every slot and queue place is taken; the client should retry later (503)."""

    status = 503
    error_type = "server_error"
    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class InternalError(ApiError):
    status = 500
    error_type = "server_error"
    default_code = "internal_error"


def error_response(error: ApiError) -> web.Response:
    return web.Response(
        status=error.status,
        body=orjson.dumps(error.body()),
        content_type="application/json",
        headers=error.headers,
    )


def from_http_exception(exc: web.HTTPException, request: web.Request) -> ApiError:
    """aiohttp raised it (routing, body size): the same failure in OpenAI's words."""
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"Unknown path: {request.method} {request.path}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return MethodNotAllowed(
            f"Method {request.method} is not allowed on {request.path}; use {allowed}",
            headers={"Allow": allowed},
        )
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge(exc.text or "Request body is larger than the limit")
    error = ApiError(exc.reason or "HTTP error")
    error.status = exc.status
    error.error_type = "invalid_request_error" if exc.status < 500 else "server_error"
    return error


def from_domain_error(exc: Exception) -> ApiError | None:
    """The node's own typed failures outside the API layer, in OpenAI's words."""
    from node.sessions import SessionNotFound
    from node.warm import WarmFailed

    if isinstance(exc, SessionNotFound):
        return NotFound(str(exc), param="session", code="session_not_found")
    if isinstance(exc, WarmFailed):
        return Overloaded(str(exc), retry_after_s=1)
    return None


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turns every failure of a handler into one OpenAI error response."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(from_http_exception(exc, request))
    except Exception as exc:
        mapped = from_domain_error(exc)
        if mapped is not None:
            return error_response(mapped)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(InternalError("The server failed to process the request"))
