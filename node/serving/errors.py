"""The serving layer's typed failures: what went wrong with a request, in words, never in HTTP.

Parsing, the service, sessions and warm-ahead raise these; the API turns each of them into
a status and OpenAI's error object in one place (node/api/errors.py, by type). A failure
carries the message a client reads, the request field it is about (`param`) and a short
machine-readable `code`; `Overloaded` also says when to retry.
"""

from __future__ import annotations


class ServingError(Exception):
    """Base of every failure the serving layer reports to a client."""

    default_code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param


class InvalidRequest(ServingError):
    """The request is malformed: wrong JSON, wrong type, value out of range."""


class UnsupportedFeature(InvalidRequest):
    """A real OpenAI feature this node does not offer (tools, images, ...)."""

    default_code = "unsupported_feature"


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus max_tokens) can never fit the context."""

    default_code = "context_length_exceeded"


class NotFound(ServingError):
    """What the request names does not exist here."""

    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class Overloaded(ServingError):
    """Every slot and queue place is taken, or the node is stopping: retry later."""

    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GenerationFailed(ServingError):
    """The engine ended a generation with an error (it keeps serving everyone else)."""

    default_code = "internal_error"


def generation_failure(reason: str, error: str | None, retry_after_s: int = 0) -> ServingError:
    """What a generation the engine ended without completing becomes: `Overloaded` when it never
    started because no room came free in time (`Finished.retry_after_s`), else `GenerationFailed`."""
    if retry_after_s > 0:
        return Overloaded(f"The node is busy: {error or 'no room came free in time'}", retry_after_s=retry_after_s)
    return GenerationFailed(f"Generation {reason}: {error or 'no detail'}")
