"""The engine's typed errors: every failure the engine reports has one of these types.

The serving layer turns the ones `submit` raises into its own typed errors, by type (never
by message text), in one place (node/serving/service.py), and the API those into HTTP:
`EngineOverloaded` ends as a 503, `PromptTooLong` and `InvalidRequest` (a grammar that does
not compile included) as 400s.
Errors that happen inside the engine thread to one request end that request with
`Finished(reason="error", error=str(exc))` instead of being raised.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises or reports."""


class ModelLoadError(EngineError):
    """The GGUF could not be loaded or a context could not be created for it."""


class EngineClosed(EngineError):
    """The engine was closed: no more requests are accepted."""


class EngineOverloaded(EngineError):
    """The bounded wait queue is full; the caller should retry later (HTTP 503)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidRequest(EngineError):
    """A request the engine can never run as given (bad token id, bad sampling value)."""


class PromptTooLong(InvalidRequest):
    """prompt + max_tokens can never fit the context (per sequence: `n_ctx` is the share of
    the KV one sequence may use), however empty the engine is."""

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int, what: str = "") -> None:
        super().__init__(
            f"prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} exceeds "
            f"the context of {n_ctx} tokens{what}"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
