"""TLS on ARCA's listener, done by ARCA: the handshake and the records through an
`ssl.SSLObject` over memory BIOs, so that a refused handshake is told to the client.

asyncio's own TLS (and uvloop's) closes the socket at once when the server's handshake
fails, before the alert OpenSSL wrote (`unknown ca` for a client certificate from another
CA, `protocol version`, ...) leaves its buffer: the client saw a bare EOF ("Server closed
the connection"). Here `TLSStream`, a plain stream protocol on the accepted socket, runs the
handshake itself; on failure it sends the alert, half-closes, discards what the client
still sends for up to `LINGER_SECONDS` (closing with unread data would reset the
connection and could destroy the alert before the client reads it) and then closes, and
calls `refused(peer, reason, error)` so the server logs and counts it. On success it gives
the application protocol (arca/connection.py's Connection) a `TLSTransport`: write,
close, abort, pause/resume reading, the write buffer and `get_extra_info` ("peercert",
"sslcontext", "ssl_object", "cipher", then the socket's own), with the records encrypted
and decrypted on the way.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, Callable

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_SECONDS = 10.0
LINGER_SECONDS = 2.0
READ_CHUNK = 256 * 1024

Refused = Callable[[str, str, "ssl.SSLError | None"], None]  # (peer, reason, the error; None: timed out)


def describe(error: ssl.SSLError) -> str:
    """The handshake failure in a few words: the verification message for a certificate."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"client certificate rejected: {error.verify_message} (verify code {error.verify_code})"
    return f"TLS handshake failed: {error.reason or error}"


class TLSStream(asyncio.Protocol):
    """The protocol on the raw socket of one TLS connection (see the module docstring)."""

    def __init__(self, context: ssl.SSLContext, app_factory: Callable[[], asyncio.Protocol],
                 refused: Refused, handshake_timeout: float | None = None) -> None:
        self._context = context
        self._app_factory = app_factory
        self._refused_cb = refused
        self._handshake_timeout = HANDSHAKE_TIMEOUT_SECONDS if handshake_timeout is None else handshake_timeout
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.raw: asyncio.Transport | None = None
        self.app: asyncio.Protocol | None = None  # from the completed handshake on
        self._timer: asyncio.TimerHandle | None = None
        self._refusing = False
        self._reading_paused = False
        self.closing = False
        self._peer = "?"

    # -- the raw socket's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = raw = transport  # type: ignore[assignment]  # a stream server's transport
        peer = raw.get_extra_info("peername") or ("?", 0)
        self._peer = f"{peer[0]}:{peer[1]}"
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self._refusing or self.closing:
            return  # lingering after a refusal, or closing: what the client sends is dropped
        self._incoming.write(data)
        if self.app is None:
            self._handshake()
        if self.app is not None and not self._reading_paused:
            self._read_records()

    def eof_received(self) -> bool | None:
        if self.app is None or self._refusing:
            return False  # the raw transport closes
        return self.app.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.raw = None
        if self.app is not None:
            app, self.app = self.app, None
            app.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.app is not None:
            self.app.resume_writing()

    # -- the handshake

    def _handshake(self) -> None:
        try:
            self.ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except ssl.SSLError as error:
            self._refuse(describe(error), error)
            return
        self._flush()
        self._cancel_timer()
        self.app = self._app_factory()
        self.app.connection_made(TLSTransport(self))

    def _refuse(self, reason: str, error: ssl.SSLError | None) -> None:
        self._refusing = True
        self._cancel_timer()
        self._flush()  # the alert OpenSSL wrote, if any
        self._refused_cb(self._peer, reason, error)
        raw = self.raw
        if raw is None:
            return
        if raw.can_write_eof():
            raw.write_eof()
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(LINGER_SECONDS, raw.close)
        else:
            raw.close()

    def _timed_out(self) -> None:
        self._timer = None
        if self.app is None and not self._refusing and self.raw is not None:
            self._refused_cb(self._peer, f"no TLS handshake within {self._handshake_timeout:g} s", None)
            self._refusing = True
            self.raw.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- records

    def _flush(self) -> None:
        if self._outgoing.pending and self.raw is not None:
            self.raw.write(self._outgoing.read())

    def _read_records(self) -> None:
        """Decrypt what has arrived and hand it to the application in one piece."""
        chunks = []
        eof = False
        while True:
            try:
                chunk = self.ssl.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify: its end of the stream
                eof = True
                break
            except ssl.SSLError as error:
                log.debug("TLS record from %s refused: %s", self._peer, error)
                self._flush()
                if self.raw is not None:
                    self.raw.abort()
                return
            if not chunk:  # what ssl answers for a close_notify read off a memory BIO
                eof = True
                break
            chunks.append(chunk)
        self._flush()  # what reading produced (TLS 1.3 session tickets, key updates)
        if chunks and self.app is not None:
            self.app.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if eof and self.app is not None and not self.app.eof_received() and self.raw is not None:
            self.close()

    # -- what TLSTransport asks

    def write(self, data: bytes) -> None:
        if self.closing or self.raw is None:
            return
        self.ssl.write(data)
        self._flush()

    def close(self) -> None:
        if self.closing or self.raw is None:
            return
        self.closing = True
        try:
            self.ssl.unwrap()  # close_notify; the client's own is not waited for
        except ssl.SSLError:
            pass
        self._flush()
        self.raw.close()

    def pause_reading(self) -> None:
        self._reading_paused = True
        if self.raw is not None:
            self.raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading_paused:
            return
        self._reading_paused = False
        if self.raw is not None:
            self.raw.resume_reading()
            # Records decrypted-ready in the BIO while reading was paused.
            asyncio.get_running_loop().call_soon(self._resume_records)

    def _resume_records(self) -> None:
        if self.app is not None and not self._reading_paused and not self.closing:
            self._read_records()


class TLSTransport(asyncio.Transport):
    """The transport the application protocol of a TLS connection writes to."""

    def __init__(self, stream: TLSStream) -> None:
        super().__init__()
        self._stream = stream

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._stream.write(bytes(data) if not isinstance(data, bytes) else data)

    def writelines(self, list_of_data) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        self._stream.close()

    def abort(self) -> None:
        self._stream.closing = True
        if self._stream.raw is not None:
            self._stream.raw.abort()

    def is_closing(self) -> bool:
        raw = self._stream.raw
        return self._stream.closing or raw is None or raw.is_closing()

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self._stream.pause_reading()

    def resume_reading(self) -> None:
        self._stream.resume_reading()

    def is_reading(self) -> bool:
        return not self._stream._reading_paused

    def get_write_buffer_size(self) -> int:
        raw = self._stream.raw
        return raw.get_write_buffer_size() if raw is not None else 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._stream.raw is not None:
            self._stream.raw.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        stream = self._stream
        if name == "peercert":
            return stream.ssl.getpeercert()
        if name == "sslcontext":
            return stream.ssl.context
        if name == "ssl_object":
            return stream.ssl
        if name == "cipher":
            return stream.ssl.cipher()
        if name == "compression":
            return stream.ssl.compression()
        return stream.raw.get_extra_info(name, default) if stream.raw is not None else default
