"""The RESP wire format: request decoding (with every limit) and reply encoding (RESP2/RESP3).

Decoding has two paths. The fast path hands a read that starts on a command boundary to
`hiredis.Reader` and accepts its result only when the read held nothing but complete,
canonical multibulk commands (see `Decoder._fast`). Everything else (inline
commands, a command split across reads, malformed input) goes through `_SlowParser`, a
resumable parser written to Redis's own rules and error strings, which also enforces the
limits: bulk length, elements per command, inline line length and the per-client query
buffer. A protocol error ends the connection after its `-ERR Protocol error: ...` reply.

Encoding turns the reply values commands return (see arca.commands.registry) into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import hiredis

_NOT_ENOUGH = object()  # hiredis' "no complete reply yet" marker; never a real value
CRLF = b"\r\n"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection input limits (Redis names in brackets)."""

    max_bulk_len: int = 64 * 1024 * 1024  # [proto-max-bulk-len]
    max_multibulk_len: int = 1024 * 1024  # elements in one command
    max_inline_len: int = 64 * 1024  # one inline command line
    max_query_buffer: int = 128 * 1024 * 1024  # [client-query-buffer-limit] unparsed bytes
    unauthenticated: bool = False  # the tight limits for a client that has not authenticated

    @property
    def length_error(self) -> str:
        """Redis names the stricter pre-authentication limits in its error text."""
        return "unauthenticated" if self.unauthenticated else "invalid"


# Before AUTH a client may send only small commands (Redis does the same), so a stranger
# cannot make the server buffer big requests it will refuse anyway.
UNAUTHENTICATED = Limits(max_bulk_len=16384, max_multibulk_len=10, max_inline_len=16384,
                         max_query_buffer=65536, unauthenticated=True)


class ProtocolError(Exception):
    """Malformed or oversized input; the text is what follows `-ERR Protocol error: `."""


class Status(str):
    """A simple-string reply (`+OK`)."""

    __slots__ = ()


class ErrorReply(str):
    """An error reply; the text starts with its prefix (`ERR`, `WRONGTYPE`, `NOAUTH`, ...)."""

    __slots__ = ()


OK = Status("OK")


class SetReply(list):
    """A reply RESP3 sends as a set (`~`) and RESP2 as an array; its items keep their order."""

    __slots__ = ()


class _NoReply:
    """What a command returns when the client must get nothing back (SHUTDOWN)."""

    __slots__ = ()


NO_REPLY = _NoReply()


class _NullArray:
    """A null array (`*-1` in RESP2, `_` in RESP3): EXEC's reply when a watched key changed."""

    __slots__ = ()


NULL_ARRAY = _NullArray()


# ---------------------------------------------------------------------------- decoding


_LIST_ONLY = {list}


def _parse_int(line: bytes) -> int | None:
    """Redis's string2ll: optional '-', digits, no leading zeros or '+', fits in 64 bits."""
    if not line or len(line) > 20:
        return None
    body = line[1:] if line[:1] == b"-" else line
    if not body.isdigit() or (body[:1] == b"0" and len(line) > 1):
        return None
    value = int(line)
    return value if -(2**63) <= value < 2**63 else None


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b", ord("a"): b"\a"}
_HEX = b"0123456789abcdefABCDEF"
_SPACE = b" \t\n\r\v\f"
_DQ, _SQ, _BACKSLASH = 0x22, 0x27, 0x5C


def _quoted(line: bytes, i: int, quote: int, out: bytearray) -> int:
    """Copy the quoted text starting after the opening quote at line[i-1]; return the index after it.

    Double quotes understand \\xHH and \\n-style escapes, single quotes only \\'. The closing
    quote must end the argument (Redis's sdssplitargs rules).
    """
    n = len(line)
    while i < n:
        ch = line[i]
        if ch == quote:
            if i + 1 < n and line[i + 1] not in _SPACE:
                break
            return i + 1
        if ch == _BACKSLASH and i + 1 < n and quote == _DQ:
            if line[i + 1] == 0x78 and i + 3 < n and line[i + 2] in _HEX and line[i + 3] in _HEX:
                out.append(int(line[i + 2 : i + 4], 16))
                i += 4
                continue
            out += _ESCAPES.get(line[i + 1], line[i + 1 : i + 2])
            i += 2
            continue
        if ch == _BACKSLASH and i + 1 < n and line[i + 1] == _SQ:
            out.append(_SQ)
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ProtocolError("unbalanced quotes in request")


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command the way redis-cli and Redis do (sdssplitargs quoting)."""
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _SPACE:
            i += 1
        if i >= n:
            return args
        current = bytearray()
        while i < n and line[i] not in _SPACE:
            if line[i] in (_DQ, _SQ):
                i = _quoted(line, i + 1, line[i], current)
            else:
                current.append(line[i])
                i += 1
        args.append(bytes(current))


class _SlowParser:
    """Resumable parser for everything the fast path declines, with Redis's error texts."""

    __slots__ = ("limits", "buf", "pos", "need", "args", "args_bytes", "bulk")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.buf = bytearray()
        self.pos = 0
        self.need = 0  # elements still missing in the current multibulk; 0 = at a boundary
        self.args: list[bytes] = []
        self.args_bytes = 0  # bytes of the current command's finished arguments
        self.bulk = -1  # length of the bulk being waited for, -1 = expecting a '$' line

    @property
    def idle(self) -> bool:
        return not self.buf and self.need == 0

    def feed(self, data: bytes, out: list[list[bytes]]) -> None:
        """Append data and move every complete command to `out`; raise ProtocolError on bad input."""
        self.buf += data
        try:
            self._parse(out)
        finally:
            if self.pos:
                del self.buf[: self.pos]
                self.pos = 0
        if len(self.buf) + self.args_bytes > self.limits.max_query_buffer:
            raise ProtocolError("client query buffer limit exceeded")

    def _line(self, too_long: str) -> bytes | None:
        end = self.buf.find(b"\r", self.pos)
        if end < 0 or end + 1 >= len(self.buf):
            if len(self.buf) - self.pos > self.limits.max_inline_len:
                raise ProtocolError(too_long)
            return None
        line = bytes(self.buf[self.pos + 1 : end])
        self.pos = end + 2
        return line

    def _parse(self, out: list[list[bytes]]) -> None:
        buf, limits = self.buf, self.limits
        while self.pos < len(buf) or self.need:
            if self.need == 0:
                if buf[self.pos] != 0x2A:  # not '*': an inline command
                    if not self._inline(out):
                        return
                    continue
                line = self._line("too big mbulk count string")
                if line is None:
                    return
                count = _parse_int(line)
                if count is None:
                    raise ProtocolError("invalid multibulk length")
                if count > limits.max_multibulk_len:
                    raise ProtocolError(f"{limits.length_error} multibulk length")
                if count <= 0:
                    continue
                self.need, self.args = count, []
            if self.bulk < 0:
                if self.pos >= len(buf):
                    return
                if buf[self.pos] != 0x24:
                    raise ProtocolError(f"expected '$', got '{chr(buf[self.pos])}'")
                line = self._line("too big bulk count string")
                if line is None:
                    return
                length = _parse_int(line)
                if length is None or length < 0:
                    raise ProtocolError("invalid bulk length")
                if length > limits.max_bulk_len:
                    raise ProtocolError(f"{limits.length_error} bulk length")
                self.bulk = length
            if len(buf) - self.pos < self.bulk + 2:
                return
            self.args.append(bytes(buf[self.pos : self.pos + self.bulk]))
            self.args_bytes += self.bulk
            self.pos += self.bulk + 2
            self.bulk = -1
            self.need -= 1
            if self.need == 0:
                out.append(self.args)
                self.args, self.args_bytes = [], 0

    def _inline(self, out: list[list[bytes]]) -> bool:
        end = self.buf.find(b"\n", self.pos)
        if end < 0:
            if len(self.buf) - self.pos > self.limits.max_inline_len:
                raise ProtocolError("too big inline request")
            return False
        if end - self.pos > self.limits.max_inline_len:
            raise ProtocolError("too big inline request")
        line = bytes(self.buf[self.pos : end])
        self.pos = end + 1
        args = split_inline(line)
        if len(args) > self.limits.max_multibulk_len:
            raise ProtocolError(f"{self.limits.length_error} multibulk length")
        if args:
            out.append(args)
        return True


class Decoder:
    """Turns the bytes of one connection into argv lists (lists of bytes).

    `feed(data)` returns the complete commands the data finished, in order. When the data
    also holds a protocol violation, the commands before it are returned and `error` is set
    (the caller answers them, then the error, then closes the connection).
    """

    __slots__ = ("_reader", "_slow", "_fast_max", "_inline_max", "error")

    def __init__(self, limits: Limits | None = None) -> None:
        self._reader = hiredis.Reader(notEnoughData=_NOT_ENOUGH)
        self._slow = _SlowParser(limits or Limits())
        self.error: str | None = None
        self.set_limits(limits or Limits())

    def set_limits(self, limits: Limits) -> None:
        """Apply other limits from the next command on (after a client authenticates)."""
        self._slow.limits = limits
        # A read shorter than this cannot hide an over-limit bulk or element count, so the
        # fast path needs no per-item limit checks.
        self._fast_max = min(limits.max_bulk_len, 6 * limits.max_multibulk_len, 1 << 20)
        self._inline_max = min(limits.max_inline_len, 2 * limits.max_multibulk_len)

    @property
    def idle(self) -> bool:
        """At a command boundary with nothing buffered and no protocol error."""
        return self.error is None and self._slow.idle

    @property
    def buffered(self) -> int:
        """Bytes of incomplete commands held for this connection."""
        return len(self._slow.buf)

    def discard(self) -> None:
        """Drop everything buffered (the connection closed); the decoder is not fed again."""
        self._slow = _SlowParser(self._slow.limits)
        self._reader = hiredis.Reader(notEnoughData=_NOT_ENOUGH)

    def feed(self, data: bytes) -> list[list[bytes]]:
        if self._slow.idle and len(data) <= self._fast_max and self.error is None:
            if data[:1] == b"*":
                commands = self._fast(data)
                if commands is not None:
                    return commands
            elif self._plain_inline(data):
                return [args for line in data.split(b"\n") if (args := line.split())]
        if self.error is not None:
            return []
        out: list[list[bytes]] = []
        try:
            self._slow.feed(data, out)
        except ProtocolError as exc:
            self.error = str(exc)
        return out

    def _plain_inline(self, data: bytes) -> bool:
        """Whole inline lines without quotes or multibulk: plain whitespace splitting is exact."""
        return (data[-1:] == b"\n" and len(data) <= self._inline_max
                and b'"' not in data and b"'" not in data and b"\n*" not in data)

    def _fast(self, data: bytes) -> list[list[bytes]] | None:
        """All commands of `data` if it holds only complete, canonical multibulk commands.

        hiredis also accepts reply types a client must not send (`+simple` or `=verbatim`
        items, RESP3 sets, nested arrays, numbers). Non-list commands and non-bytes items are
        caught by type; a string item not sent as `$bulk` is caught by counting: canonical
        input holds exactly one '*' per command and one '$' per item beyond those inside
        the item bytes themselves. Anything else takes the exact slow path.
        """
        reader = self._reader
        reader.feed(data)
        gets = reader.gets
        try:
            first = gets()
            if first is _NOT_ENOUGH:
                commands = None
            elif (second := gets()) is _NOT_ENOUGH:  # one command: no pipelining
                if type(first) is list and first and not reader.has_data() and _canonical_items(data, first, 1):
                    return [first]
                commands = None
            else:
                commands = [first, second]
                append = commands.append
                while (command := gets()) is not _NOT_ENOUGH:
                    append(command)
            if commands is not None and not reader.has_data() and _canonical(data, commands):
                if [] in commands:  # '*0' is a no-op in Redis
                    commands = [c for c in commands if c]
                return commands
        except (hiredis.ProtocolError, TypeError):
            pass
        self._reader = hiredis.Reader(notEnoughData=_NOT_ENOUGH)
        return None


def _canonical(data: bytes, commands: list) -> bool:
    """Whether `data` held `commands` as multibulk arrays of `$` bulk strings and nothing else.

    Raises TypeError for an item that is not a string (a number, a nested array, a null).
    """
    if set(map(type, commands)) != _LIST_ONLY:
        return False
    return _canonical_items(data, list(chain.from_iterable(commands)), len(commands))


def _canonical_items(data: bytes, items: list, commands: int) -> bool:
    """One '*' per command and one '$' per item outside the item bytes (see Decoder._fast)."""
    payload = b"".join(items)
    return (data.count(b"$") == len(items) + payload.count(b"$")
            and data.count(b"*") == commands + payload.count(b"*"))


# ---------------------------------------------------------------------------- encoding

_NULL = {2: b"$-1\r\n", 3: b"_\r\n"}
_INTS = [b":%d\r\n" % i for i in range(-1, 1025)]


def _error_line(text: str) -> bytes:
    return b"-" + text.replace("\r", " ").replace("\n", " ").encode("utf-8", "replace") + CRLF


def encode_error(text: str) -> bytes:
    return _error_line(text)


def encode(value: Any, resp: int = 2) -> bytes:
    """One reply value as RESP bytes for a connection speaking RESP2 or RESP3."""
    kind = type(value)
    if kind is bytes:
        return b"$%d\r\n%b\r\n" % (len(value), value)
    if kind is Status:
        return b"+" + value.encode() + CRLF
    if value is None:
        return _NULL[resp]
    if kind is int:
        return _INTS[value + 1] if -1 <= value < 1024 else b":%d\r\n" % value
    if kind is ErrorReply:
        return _error_line(value)
    if kind is bool:
        if resp == 3:
            return b"#t\r\n" if value else b"#f\r\n"
        return b":1\r\n" if value else b":0\r\n"
    if kind is list or kind is tuple:
        return b"*%d\r\n" % len(value) + b"".join([encode(item, resp) for item in value])
    if kind is SetReply:
        head = b"~%d\r\n" if resp == 3 else b"*%d\r\n"
        return head % len(value) + b"".join([encode(item, resp) for item in value])
    if kind is dict:
        if resp == 3:
            head = b"%%%d\r\n" % len(value)
        else:
            head = b"*%d\r\n" % (2 * len(value))
        return head + b"".join([encode(k, resp) + encode(v, resp) for k, v in value.items()])
    if kind is float:
        text = repr(value).encode() if value == value else b"nan"
        if text.endswith(b".0"):
            text = text[:-2]  # Redis prints integral doubles without a fraction
        return b",%b\r\n" % text if resp == 3 else b"$%d\r\n%b\r\n" % (len(text), text)
    if kind is str:
        return encode(value.encode("utf-8"), resp)
    if isinstance(value, (bytearray, memoryview)):
        return encode(bytes(value), resp)
    if isinstance(value, int):  # int subclasses (IntEnum and the like)
        return encode(int(value), resp)
    if value is NO_REPLY:
        return b""
    if value is NULL_ARRAY:
        return b"*-1\r\n" if resp == 2 else b"_\r\n"
    raise TypeError(f"cannot encode a reply of type {kind.__name__}")
