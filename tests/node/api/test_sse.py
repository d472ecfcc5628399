"""SSE framing on a real aiohttp server: data frames, [DONE], and an error after the start."""

from __future__ import annotations

import aiohttp
import orjson
from aiohttp import web

from node.api.errors import error_reply
from node.serving.errors import Overloaded
from node.api.runner import start_site
from node.api.sse import EventStream


async def stream_then_fail(request: web.Request) -> web.StreamResponse:
    stream = EventStream(request, {"X-Test": "1"})
    await stream.open()
    await stream.send({"n": 1})
    await stream.send_all([{"n": 2}, {"n": 3}])
    await stream.fail(error_reply(Overloaded("engine went away")))
    return stream.response


async def stream_ok(request: web.Request) -> web.StreamResponse:
    stream = EventStream(request)
    await stream.open()
    await stream.send({"text": "é\n"})
    await stream.done()
    return stream.response


async def test_frames_and_in_band_error():
    app = web.Application()
    app.router.add_get("/fail", stream_then_fail)
    app.router.add_get("/ok", stream_ok)
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/fail") as response:
                assert response.status == 200  # the status was sent before the failure
                assert response.headers["X-Test"] == "1"
                assert response.headers["Cache-Control"] == "no-cache"
                raw = await response.read()
            async with session.get(f"http://127.0.0.1:{port}/ok") as response:
                ok = await response.read()
    finally:
        await runner.cleanup()
    error = orjson.dumps(error_reply(Overloaded("engine went away")).body())
    assert raw == (b'data: {"n":1}\n\ndata: {"n":2}\n\ndata: {"n":3}\n\n'
                   b"event: error\ndata: " + error + b"\n\ndata: [DONE]\n\n")
    assert ok == b'data: {"text":"\xc3\xa9\\n"}\n\ndata: [DONE]\n\n'  # newlines stay escaped inside JSON
