"""Server-sent events framing for streamed completions.

A stream is opened once (status 200, `text/event-stream`); after that nothing can change
the status, so a failure is written as an SSE `error` event carrying OpenAI's error object,
followed by `data: [DONE]` (the error object comes from node/api/errors.py's one mapping). Every frame is `data: <json>\\n\\n`; several frames may be
written at once (a cached answer goes out in one write).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import orjson
from aiohttp import web

from node.api.errors import ErrorReply

DONE_FRAME = b"data: [DONE]\n\n"


def data_frame(payload: Mapping) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_frame(error: ErrorReply) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(error.body()) + b"\n\n"


class EventStream:
    """One SSE response: open it, send frames, end it with [DONE] or an error event."""

    def __init__(self, request: web.Request, headers: Mapping[str, str] | None = None) -> None:
        self.request = request
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **(headers or {}),
            },
        )
        self.closed = False

    @property
    def opened(self) -> bool:
        return self.response.prepared

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, payload: Mapping) -> None:
        await self.response.write(data_frame(payload))

    async def send_all(self, payloads: Iterable[Mapping]) -> None:
        data = b"".join(data_frame(payload) for payload in payloads)
        if data:
            await self.response.write(data)

    async def fail(self, error: ErrorReply) -> None:
        """The stream cannot go on: tell the client in-band, then close the stream."""
        await self.response.write(error_frame(error) + DONE_FRAME)
        await self._end()

    async def done(self) -> None:
        await self.response.write(DONE_FRAME)
        await self._end()

    async def _end(self) -> None:
        if not self.closed:
            self.closed = True
            await self.response.write_eof()
