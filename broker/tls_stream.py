"""TLS over a connection that has already carried bytes: a listener with both
`proxy_protocol` and TLS (`ssl`, `wss`). The PROXY header comes before the TLS handshake,
and the bytes read with it may hold the start of the client's ClientHello, which asyncio's
`start_tls` cannot be given; so TLS is done here over memory BIOs (`ssl.SSLObject`), the
stdlib's own engine, with the listener's context (its certificate reloads work the same).

`TlsStream` is the socket's protocol: it runs the handshake, then hands decrypted bytes to
the protocol above it (the MQTT Connection, or the WebSocket protocol), which writes to a
`TlsStreamTransport`: one TLS record per write, reading, pausing and the write buffer's
flow control being the socket's. Listeners without a PROXY header use asyncio's own TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nautilus.connection")

READ = 64 * 1024  # decrypted bytes read per call


class TlsStream(asyncio.Protocol):
    def __init__(
        self,
        context: ssl.SSLContext,
        make_inner: Callable[[], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
        timeout: float,
    ) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.make_inner = make_inner
        self.loop = loop
        self.timeout = timeout
        self.socket: asyncio.Transport | None = None
        self.inner: asyncio.Protocol | None = None  # once the handshake is done
        self.peer: tuple[str, int] | None = None  # a PROXY header's client, for the inner
        self._timer: asyncio.TimerHandle | None = None

    def use_peer(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.socket = transport  # type: ignore[assignment]
        self._timer = self.loop.call_later(self.timeout, self._give_up)

    def data_received(self, data: bytes) -> None:
        self.incoming.write(data)
        if self.inner is None:
            self._handshake()
        if self.inner is not None:
            self._read()

    def _handshake(self) -> None:
        assert self.socket is not None
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self.flush()
            return
        except (ssl.SSLError, ssl.CertificateError) as exc:
            self.flush()  # the alert, if any
            log.info("%s: TLS handshake failed: %s", self.socket.get_extra_info("peername"), exc)
            self.socket.close()
            return
        self.flush()
        self._stop_timer()
        self.inner = self.make_inner()
        self.inner.connection_made(TlsStreamTransport(self))
        if self.peer is not None:
            self.inner.use_peer(self.peer)  # type: ignore[attr-defined]

    def _read(self) -> None:
        inner = self.inner
        assert inner is not None and self.socket is not None
        while not self.socket.is_closing():
            try:
                data = self.tls.read(READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify
                self.socket.close()
                break
            except ssl.SSLError as exc:
                log.info("%s: TLS error: %s", self.socket.get_extra_info("peername"), exc)
                self.socket.close()
                break
            if not data:
                break
            inner.data_received(data)
        self.flush()  # e.g. TLS 1.3 session tickets

    def flush(self) -> None:
        if self.outgoing.pending and self.socket is not None and not self.socket.is_closing():
            self.socket.write(self.outgoing.read())

    def eof_received(self) -> bool | None:
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def _give_up(self) -> None:
        if self.socket is not None and self.inner is None:
            log.info("%s: no TLS handshake in time", self.socket.get_extra_info("peername"))
            self.socket.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class TlsStreamTransport(asyncio.Transport):
    """What the protocol above TLS writes to: each write one TLS record."""

    def __init__(self, stream: TlsStream) -> None:
        super().__init__()
        assert stream.socket is not None
        self.stream = stream
        self.socket = stream.socket
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.socket.is_closing():
            return
        self.stream.tls.write(data)
        self.stream.flush()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        """close_notify, then the socket (the client's own close_notify is not awaited)."""
        if self._closing:
            return
        self._closing = True
        # unwrap waits for the client's close_notify (an error here): ours is written anyway.
        with contextlib.suppress(ssl.SSLError):
            self.stream.tls.unwrap()
        self.stream.flush()
        self.socket.close()

    def abort(self) -> None:
        self._closing = True
        self.socket.abort()

    def is_closing(self) -> bool:
        return self._closing or self.socket.is_closing()

    def pause_reading(self) -> None:
        self.socket.pause_reading()

    def resume_reading(self) -> None:
        self.socket.resume_reading()

    def is_reading(self) -> bool:
        return self.socket.is_reading()

    def get_write_buffer_size(self) -> int:
        return self.socket.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self.stream.tls
        if name == "peercert":
            return self.stream.tls.getpeercert()
        return self.socket.get_extra_info(name, default)
