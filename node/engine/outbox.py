"""Events on their way from the engine thread to the callers' event loops, one wake-up a step.

An event for a caller on an asyncio loop crosses threads by `loop.call_soon_threadsafe`, which
writes a byte to the loop's wake-up socket every time. The engine thread pushes an event per
sequence per step (a text delta, a finish), and each of those writes woke the loop in the
middle of the step: the loop's thread then took the interpreter while the engine thread was
still choosing the other rows' tokens, and the engine thread waited for it back. In a
Conclave's steps (5-6 sequences sampling) a push cost 90 us of the engine thread's time, about
0.5 ms a step of the 3 ms it spent outside llama_decode.

While a step runs (`hold` ... `release`, node/engine/scheduler.py) the outbox keeps the events
and hands each loop its step's events in one call at the step's end, so the loop runs its
callers while the engine thread waits in the next llama_decode, which releases the
interpreter. The order of one channel's events is kept (a step's in the order pushed, steps
in order). A push outside a step (the engine's shutdown) goes at once. A loop found closed
counts as a cancel for each of its channels, as a push straight to it does.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Receiver(Protocol):
    """The caller's side of a channel, as the outbox sees it (node/engine/sequence.py's Channel)."""

    cancelled: bool

    def deliver(self, event: Any) -> None: ...


class Outbox:
    """Events held per loop while a step runs; touched by the engine thread only."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[asyncio.AbstractEventLoop, list[tuple[Receiver, Any]]] | None = None

    def hold(self) -> None:
        """From now until `release`, events wait for the step's end."""
        if self._held is None:
            self._held = {}

    def post(self, loop: asyncio.AbstractEventLoop, receiver: Receiver, event: Any) -> None:
        """Send `event` to `receiver` on `loop`: kept until `release` while holding, else now."""
        if self._held is not None:
            self._held.setdefault(loop, []).append((receiver, event))
            return
        try:
            loop.call_soon_threadsafe(receiver.deliver, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            receiver.cancelled = True

    def release(self) -> None:
        """Hand each loop the events held for it, in one call each; stop holding."""
        held, self._held = self._held, None
        for loop, items in (held or {}).items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                for receiver, _ in items:
                    receiver.cancelled = True


def _deliver(items: list[tuple[Receiver, Any]]) -> None:
    """On the loop: each event to its receiver, in the order pushed."""
    for receiver, event in items:
        receiver.deliver(event)
