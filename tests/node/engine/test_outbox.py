"""The outbox: a step's events reach each caller's loop in one wake-up, in order, and a closed
loop counts as a cancel. Real asyncio loops on threads of their own, real channels; the wake-ups
are counted by wrapping the loop's own `call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import threading

import pytest

from node.engine.outbox import Outbox
from node.engine.sequence import Channel


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def counting(loop, monkeypatch) -> list:
    calls = []
    real = loop.call_soon_threadsafe

    def wrapped(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", wrapped)
    return calls


def channels(loop, outbox, n):
    async def make():  # on the loop, as an asyncio caller makes them
        return [Channel(loop, outbox) for _ in range(n)]

    return asyncio.run_coroutine_threadsafe(make(), loop).result(5)


def drained(loop, channel) -> list:
    async def get_all():
        out = []
        while not channel._async_queue.empty():
            out.append(channel._async_queue.get_nowait())
        return out
    return asyncio.run_coroutine_threadsafe(get_all(), loop).result(5)


def test_a_steps_events_wake_each_loop_once_and_keep_their_order(loop, monkeypatch):
    outbox = Outbox()
    a, b = channels(loop, outbox, 2)
    calls = counting(loop, monkeypatch)
    outbox.hold()
    for i in range(5):
        a.push(f"a{i}")
        b.push(f"b{i}")
    assert calls == []  # nothing crossed while the step ran
    outbox.release()
    assert len(calls) == 1
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5) is None  # the delivery ran
    assert drained(loop, a) == [f"a{i}" for i in range(5)]
    assert drained(loop, b) == [f"b{i}" for i in range(5)]


def test_outside_a_step_an_event_goes_at_once(loop, monkeypatch):
    outbox = Outbox()
    (a,) = channels(loop, outbox, 1)
    calls = counting(loop, monkeypatch)
    a.push("now")
    assert len(calls) == 1
    outbox.release()  # nothing held: nothing more sent
    assert len(calls) == 1
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
    assert drained(loop, a) == ["now"]


def test_events_for_a_closed_loop_cancel_its_channels_not_the_others(loop):
    outbox = Outbox()
    other = asyncio.new_event_loop()
    (gone,) = channels(loop, outbox, 1)
    other.close()
    gone._loop = other  # as if its caller's loop had closed
    (alive,) = channels(loop, outbox, 1)
    outbox.hold()
    gone.push("lost")
    alive.push("kept")
    outbox.release()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
    assert gone.cancelled and not alive.cancelled
    assert drained(loop, alive) == ["kept"]
