"""From token pieces to client text: whole UTF-8 characters, stop strings held back.

`IncrementalDetokenizer` takes the raw bytes of each generated token (a token may end in
the middle of a multi-byte character: byte-fallback vocabularies split emoji and CJK
into single-byte tokens) and returns only complete characters; the incomplete tail waits
for the next token. Invalid bytes become U+FFFD rather than an exception.

`StopMatcher` holds back the longest tail of the text that is still the beginning of a
stop string, so the client never sees stop text: when a stop string completes, the text
before it is released and the rest is dropped; when generation ends another way, the
held text is released by `flush()`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Sequence


class IncrementalDetokenizer:
    """Bytes of token pieces in, complete characters out."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


@dataclass(frozen=True, slots=True)
class StopScan:
    """What may be sent now, and whether a stop string ended the text."""

    text: str
    stopped: bool
    matched: str | None = None  # the stop string that ended it


class StopMatcher:
    """Releases text as soon as it can no longer be part of a stop string."""

    __slots__ = ("_stops", "_held")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    @property
    def held(self) -> str:
        return self._held

    def feed(self, text: str) -> StopScan:
        if not self._stops:
            return StopScan(text, False)
        buffer = self._held + text
        found = [(i, s) for i, s in ((buffer.find(s), s) for s in self._stops) if i >= 0]
        if found:
            cut, matched = min(found, key=lambda hit: hit[0])
            self._held = ""
            return StopScan(buffer[:cut], True, matched)
        keep = max(_partial_suffix(buffer, s) for s in self._stops)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return StopScan(buffer[: len(buffer) - keep], False)

    def flush(self) -> str:
        text, self._held = self._held, ""
        return text


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest proper prefix of `stop` that `text` ends with."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
