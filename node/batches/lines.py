"""What a batch line is, what running it returns, and who runs it.

A line of an input file is `{"custom_id", "method", "url", "body"}`; the API implements the
`LineExecutor` (node/api/batch_lines.py) with its own request parser (`check`, before a batch
starts) and the service (`run`: L1, the prefix cache and speculation apply, at batch
priority). `output_line` is the line OpenAI's Batch API writes for it: the response's status
code and body, or the error a line that could not run at all gets.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True, slots=True)
class InputLine:
    number: int        # 1-based line number in the input file
    custom_id: str
    url: str
    body: bytes        # the request body, JSON


@dataclass(frozen=True, slots=True)
class LineResult:
    status_code: int
    body: dict[str, Any]
    retry: bool = False  # the node is overloaded: run the line again later

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


class LineExecutor(Protocol):
    def check(self, url: str, body: Any) -> None:
        """Raise a ServingError if the line can never run (parsed as the live endpoint parses)."""

    async def run(self, url: str, body: bytes, tenant: str = "") -> LineResult:
        """Answer the line like the live endpoint would, for the batch's tenant (never raises for
        the line's own failures)."""


def output_line(custom_id: str, result: LineResult) -> bytes:
    """One line of the output or error file (with its newline)."""
    request_id = result.body.get("id") if result.ok else None
    record = {
        "id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
        "response": {"status_code": result.status_code, "request_id": request_id or f"req_{uuid.uuid4().hex}",
                     "body": result.body},
        "error": None,
    }
    return orjson.dumps(record) + b"\n"
