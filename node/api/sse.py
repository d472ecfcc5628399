"""Server-sent events framing for streamed answers.

A stream is opened once (status 200, `text/event-stream`); after that nothing can change
the status, so a failure is written in-band: for OpenAI's chat and completions an SSE `error`
event carrying OpenAI's error object followed by `data: [DONE]`, for the other APIs the error
frame of their own (the error comes from node/api/errors.py's one mapping). OpenAI's frames
are `data: <json>\\n\\n`; Anthropic's and the Responses API's name their events
(`event: <name>\\ndata: <json>\\n\\n`). `stream_frames` writes an answer's frames as they come
(several at once when they are ready together: a cached answer goes out in one write) and
handles the client going away and a failure after the stream started.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator, Awaitable, Callable, Iterable, Mapping

import orjson
from aiohttp import web

from node.api.errors import ErrorReply, error_reply

log = logging.getLogger(__name__)

DONE_FRAME = b"data: [DONE]\n\n"


def data_frame(payload: Mapping) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def data_frames(payloads: Iterable[Mapping]) -> bytes:
    return b"".join(data_frame(payload) for payload in payloads)


def named_frame(event: str, payload: Mapping) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def error_frame(error: ErrorReply) -> bytes:
    return named_frame("error", error.body())


def openai_error_frame(error: ErrorReply) -> bytes:
    return error_frame(error) + DONE_FRAME


async def stream_frames(request: web.Request, headers: Mapping[str, str], frames: AsyncIterator[bytes],
                        failure: Callable[[ErrorReply], bytes]) -> web.StreamResponse:
    """Open a stream, write every chunk of `frames`, end it; a failure after the start is
    written as `failure(reply)`, a client that went away ends the generation."""
    stream = EventStream(request, headers)
    await stream.open()

    async def body() -> None:
        async for data in frames:
            if data:
                await stream.response.write(data)
        await stream.end()

    async def fail(reply: ErrorReply) -> None:
        await stream.response.write(failure(reply))
        await stream.end()

    await streamed(request, body(), fail)
    return stream.response


async def streamed(request: web.Request, body: Awaitable[None],
                   fail: Callable[[ErrorReply], Awaitable[None]]) -> None:
    """Runs the body of a stream that already has its 200 (SSE here, Ollama's NDJSON too): a
    client that goes away cancels the generation; any other failure is told in-band by `fail`
    (the status cannot change any more)."""
    try:
        await body
    except ConnectionResetError:
        log.info("client went away during a stream; its generation is cancelled")
    except Exception as exc:
        reply = error_reply(exc, request, unexpected="The generation failed")
        if reply.unexpected:
            log.exception("stream failed after it started")
        try:
            await fail(reply)
        except ConnectionResetError:
            pass  # nobody is left to tell


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
        data = data_frames(payloads)
        if data:
            await self.response.write(data)

    async def fail(self, error: ErrorReply) -> None:
        """The stream cannot go on: tell the client in-band, then close the stream."""
        await self.response.write(openai_error_frame(error))
        await self.end()

    async def done(self) -> None:
        await self.response.write(DONE_FRAME)
        await self.end()

    async def end(self) -> None:
        if not self.closed:
            self.closed = True
            await self.response.write_eof()
