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

from broker.layer import Layer, LayerTransport

log = logging.getLogger("nautilus.connection")

READ = 64 * 1024  # decrypted bytes read per call


class TlsStream(Layer):
    name = "TLS"

    def __init__(
        self,
        context: ssl.SSLContext,
        make_upper: Callable[[], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
        timeout: float,
    ) -> None:
        super().__init__(loop, timeout)
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.make_upper = make_upper

    def data_received(self, data: bytes) -> None:
        self.incoming.write(data)
        if self.upper is None:
            self._handshake()
        if self.upper is not None:
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
            self.handshake_failed(self.socket.get_extra_info("peername"), exc)
            self.socket.close()
            return
        self.flush()
        self.hand_up(self.make_upper(), TlsStreamTransport(self))

    def handshake_failed(self, peer: Any, exc: ssl.SSLError) -> None:
        """Say why a client's handshake failed (the event relay's server says it its way)."""
        log.info("%s: TLS handshake failed: %s", peer, exc)

    def _read(self) -> None:
        upper = self.upper
        assert upper is not None and self.socket is not None
        while not self.socket.is_closing():
            try:
                data = self.tls.read(READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                data = b""
            except ssl.SSLError as exc:
                log.info("%s: TLS error: %s", self.socket.get_extra_info("peername"), exc)
                self.socket.close()
                break
            if not data:  # the client's close_notify (read() gives b"" for it)
                self._close_notified()
                break
            upper.data_received(data)
        self.flush()  # e.g. TLS 1.3 session tickets

    def _close_notified(self) -> None:
        """Ours in reply (an asyncio client waits for it, up to 30 s, before it closes),
        then the socket closes."""
        with contextlib.suppress(ssl.SSLError):
            self.tls.unwrap()
        self.flush()
        assert self.socket is not None
        self.socket.close()

    def flush(self) -> None:
        if self.outgoing.pending and self.socket is not None and not self.socket.is_closing():
            self.socket.write(self.outgoing.read())


class TlsStreamTransport(LayerTransport):
    """Each write one TLS record."""

    def __init__(self, stream: TlsStream) -> None:
        assert stream.socket is not None
        super().__init__(stream.socket)
        self.stream = stream

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.socket.is_closing():
            return
        self.stream.tls.write(data)
        self.stream.flush()

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

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self.stream.tls
        if name == "peercert":
            return self.stream.tls.getpeercert()
        return self.socket.get_extra_info(name, default)
