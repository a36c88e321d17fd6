# How a load-generator connection reaches a broker: plain TCP, TLS, or MQTT over
# WebSockets (ws, and wss: WebSockets over TLS); and the certificates of a run.
#
# Strategy: the MQTT client (client.MqttClient) stays the asyncio protocol it is over TCP,
# with its hot path unchanged; only the layer under it changes.
# - tls: the stdlib `ssl` module's SSLObject over memory BIOs (OpenSSL underneath, as in
#   uvloop's and asyncio's own TLS transports) on a plain TCP transport, with a context
#   trusting the run's CA. Each write is encrypted at once and handed to the TCP
#   transport, so the write buffer, pause and resume are the TCP transport's and hold
#   ciphertext only: loadgen.Flood's count of what the broker has read (written, minus
#   the write buffer, minus the kernel's buffers) stays right to TLS's few bytes per 16
#   KiB record. uvloop's TLS transport keeps ciphertext in its TCP transport's buffer too,
#   out of sight of get_write_buffer_size(): megabytes miscounted in a flood.
# - ws / wss: websockets' sans-I/O ClientProtocol makes and checks the upgrade handshake
#   (path /mqtt, subprotocol `mqtt`). After it, frames are handled here, in bulk: every
#   write is one masked binary frame (the mask applied by websockets' C speedup), and the
#   broker's frames are unwrapped without a Python step per frame where possible. A broker
#   writing one frame per packet (Mosquitto) sends long runs of identical small frames: a
#   run is recognised with strided slices, as client.py recognises runs of packets, and
#   its frame headers are cut out with two extended-slice deletions (C speed). Other
#   frames go through a per-frame loop. websockets' own frame parser costs about 2.3 µs a
#   frame in Python; at one frame per packet that alone would take a quarter of the
#   generator's core at 100k msg/s.
# - Certificates: trustme makes a CA and a server certificate for 127.0.0.1 in a temporary
#   directory, readable by Mosquitto's unprivileged user.
from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from broker.layer import LayerTransport  # the socket's reading and buffer, delegated

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask

NAMES = ("tcp", "tls", "ws", "wss")
WS_PATH = "/mqtt"
_OP_CONT, _OP_BINARY, _OP_CLOSE, _OP_PING = 0x0, 0x2, 0x8, 0x9


@dataclass(frozen=True, slots=True)
class Transport:
    """A way to reach a broker's listener; `ssl` (tls, wss) trusts its certificate."""

    name: str  # "tcp", "tls", "ws" or "wss"
    ssl: ssl.SSLContext | None = None
    path: str = WS_PATH

    @property
    def websocket(self) -> bool:
        return self.name in ("ws", "wss")

    @property
    def packet_overhead(self) -> int:
        """Bytes a broker that sends each packet on its own (one TLS record, one frame;
        Mosquitto) puts around a small packet: a TLS 1.3 record's header, content type and
        AES-GCM tag, a WebSocket frame's 2-byte header. A client's read mark (SO_RCVLOWAT)
        counts them: without them it would wake up several times as often as over TCP."""
        return (22 if self.ssl is not None else 0) + (2 if self.websocket else 0)

    async def connect(self, protocol: asyncio.Protocol, host: str, port: int) -> None:
        """Connect `protocol` (an MqttClient): its connection_made gets a transport that
        carries MQTT bytes, once the TLS and WebSocket handshakes are done."""
        loop = asyncio.get_running_loop()
        layers: list[_WebSocket | _Tls] = []
        top = protocol
        if self.websocket:
            scheme = "wss" if self.ssl is not None else "ws"
            layers.append(_WebSocket(top, f"{scheme}://{host}:{port}{self.path}"))
            top = layers[-1]
        if self.ssl is not None:
            layers.append(_Tls(top, self.ssl, host))
            top = layers[-1]
        socket, _ = await loop.create_connection(lambda: top, host, port)
        try:
            for layer in reversed(layers):  # TLS first
                await layer.opened
        except BaseException:
            socket.abort()
            raise


TCP = Transport("tcp")


class _Tls(asyncio.Protocol):
    """The socket's protocol: a TLS client over memory BIOs, plaintext to `inner`."""

    def __init__(self, inner: asyncio.Protocol, context: ssl.SSLContext, host: str):
        self.inner = inner
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.socket: asyncio.Transport | None = None
        self.transport: TlsTransport | None = None  # once the handshake is done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.socket = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self._handshake()

    def _handshake(self) -> None:
        assert self.socket is not None  # connection_made came first
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLError, ssl.CertificateError) as exc:
            self.opened.set_exception(exc)
            self.socket.abort()
            return
        else:
            self.transport = TlsTransport(self.socket, self._tls, self._outgoing)
        self._flush()
        if self.transport is not None:
            self.inner.connection_made(self.transport)
            self.opened.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._incoming.write(data)
        if self.transport is None:
            self._handshake()
            if self.transport is None:
                return
        chunks = []
        while True:
            try:
                chunk = self._tls.read(1 << 18)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        self._flush()  # what reading made OpenSSL send (a key update)
        if chunks:
            self.inner.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def _flush(self) -> None:
        if self._outgoing.pending and self.socket is not None:
            self.socket.write(self._outgoing.read())

    def eof_received(self) -> bool | None:
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the TLS handshake"))
        elif self.transport is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.inner.resume_writing()


class TlsTransport(LayerTransport):
    """What the layer above writes to: plaintext in, encrypted at once, records out."""

    def __init__(self, socket: asyncio.Transport, tls: ssl.SSLObject, outgoing: ssl.MemoryBIO):
        super().__init__(socket)
        self._tls = tls
        self._outgoing = outgoing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._tls.write(data)
            self.socket.write(self._outgoing.read())

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()  # close_notify
            if self._outgoing.pending:
                self.socket.write(self._outgoing.read())
            self.socket.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "cipher":
            return self._tls.cipher()
        if name == "ssl_object":
            return self._tls
        return self.socket.get_extra_info(name, default)


class _WebSocket(asyncio.Protocol):
    """The socket's protocol: the upgrade handshake, then frames <-> MQTT bytes."""

    def __init__(self, mqtt: asyncio.Protocol, uri: str):
        self.mqtt = mqtt
        self.handshake = ClientProtocol(
            parse_uri(uri), subprotocols=[Subprotocol("mqtt")], max_size=None
        )
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.socket: asyncio.Transport | None = None
        self.transport: WebSocketTransport | None = None  # once the handshake is done
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        socket: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's
        self.socket = socket
        handshake = self.handshake
        handshake.send_request(handshake.connect())
        for chunk in handshake.data_to_send():
            socket.write(chunk)

    def data_received(self, data: bytes) -> None:
        if self.transport is not None:
            self._frames(data)
        else:
            self._handshake(data)

    def _handshake(self, data: bytes) -> None:
        handshake = self.handshake
        handshake.receive_data(data)
        for event in handshake.events_received():
            if not isinstance(event, Response):
                continue  # the broker sends nothing before CONNECT: no frame follows yet
            assert self.socket is not None  # connection_made came first
            if handshake.state is not State.OPEN:
                error = handshake.handshake_exc or ConnectionError("WebSocket handshake failed")
                self.opened.set_exception(error)
                return
            self.transport = WebSocketTransport(self.socket)
            self.mqtt.connection_made(self.transport)
            self.opened.set_result(None)

    def _frames(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        payload = unwrap(buf, self._control)
        if payload:
            self.mqtt.data_received(payload)

    def _control(self, opcode: int, payload: bytes) -> None:
        assert self.transport is not None  # frames come after the handshake
        if opcode == _OP_PING:
            self.transport.frame(0x80 | 0xA, payload)  # pong
        elif opcode == _OP_CLOSE:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the WebSocket handshake"))
        elif self.transport is not None:
            self.mqtt.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.mqtt.resume_writing()


def unwrap(buf: bytearray, control: Any = None) -> bytes:
    """The payload of every whole data frame at the start of `buf` (server frames:
    unmasked), removed from it; control frames go to `control(opcode, payload)`."""
    out: list[bytes] = []
    pos, end = 0, len(buf)
    while end - pos >= 2:
        first, length = buf[pos], buf[pos + 1] & 0x7F
        start = pos + 2
        if length < 126:
            size = 2 + length
            count = (end - pos) // size
            if count > 2 and first & 0x0F in (_OP_CONT, _OP_BINARY):
                run = _run(buf, pos, size, count)
                if run is not None:
                    out.append(run)
                    pos += count * size
                    continue
        elif length == 126:
            start = pos + 4
            if start > end:
                break
            length = int.from_bytes(buf[pos + 2 : start], "big")
        else:
            start = pos + 10
            if start > end:
                break
            length = int.from_bytes(buf[pos + 2 : start], "big")
        stop = start + length
        if stop > end:
            break
        opcode = first & 0x0F
        if opcode in (_OP_CONT, _OP_BINARY):
            out.append(bytes(buf[start:stop]))
        elif control is not None and opcode >= _OP_CLOSE:
            control(opcode, bytes(buf[start:stop]))
        pos = stop
    del buf[:pos]
    return b"".join(out)


def _run(buf: bytearray, pos: int, size: int, count: int) -> bytes | None:
    """The payloads of `count` frames of `size` bytes from `pos`, if all have the header
    of the first one (2 bytes: each says the next frame starts `size` further), else None."""
    end = pos + count * size
    for i in (0, 1):
        if buf[pos + i : end : size].count(buf[pos + i]) != count:
            return None
    run = buf[pos:end]
    del run[0::size]  # the first header byte of every frame
    del run[0 :: size - 1]  # then the second
    return bytes(run)


class WebSocketTransport(LayerTransport):
    """What the MQTT client writes to: each write one masked binary frame."""

    def frame(self, first: int, data: bytes | bytearray | memoryview) -> None:
        length = len(data)
        if length < 126:
            head = bytes((first, 0x80 | length))
        elif length < 1 << 16:
            head = bytes((first, 0x80 | 126)) + length.to_bytes(2, "big")
        else:
            head = bytes((first, 0x80 | 127)) + length.to_bytes(8, "big")
        mask = os.urandom(4)
        # The C speedup takes any buffer; its Python fallback too (int.from_bytes).
        self.socket.write(head + mask + apply_mask(cast(bytes, data), mask))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self.frame(0x80 | _OP_BINARY, data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))  # one frame: MQTT packets need not align

    def close(self) -> None:
        if not self._closing:
            self.frame(0x80 | _OP_CLOSE, (1000).to_bytes(2, "big"))
            self._closing = True
            self.socket.close()


@dataclass(frozen=True, slots=True)
class Certificates:
    """A CA and a server certificate for 127.0.0.1 and localhost, as PEM files."""

    directory: Path
    ca: Path
    cert: Path  # the server's certificate chain
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting the CA (and checking the host name)."""
        return ssl.create_default_context(cafile=str(self.ca))


def make_certificates(directory: Path | None = None) -> Certificates:
    """Issue the certificates into `directory` (a new temporary one by default)."""
    import trustme  # only needed for TLS

    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="bench-certs-"))
    # Mosquitto drops to its own user before it reads them: world-readable (a test key).
    directory.chmod(0o755)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = Certificates(
        directory, directory / "ca.pem", directory / "server.pem", directory / "server.key"
    )
    ca.cert_pem.write_to_path(str(files.ca))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.key))
    for path in (files.ca, files.cert, files.key):
        path.chmod(0o644)
    return files


def transports(names: list[str], certificates: Certificates | None) -> dict[str, Transport]:
    """The client side of each transport named (tls and wss need `certificates`)."""
    result = {}
    for name in names:
        context = None
        if name in ("tls", "wss"):
            assert certificates is not None
            context = certificates.client_context()
        result[name] = Transport(name, context)
    return result
