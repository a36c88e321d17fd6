# A null broker for calibrating the load generator: `python -m bench.nullbroker --port N`.
#
# It answers CONNECT and SUBSCRIBE, then pipes every byte a publishing connection sends,
# unparsed, to every subscriber. For one QoS 0 publisher the forwarded bytes are exactly
# the PUBLISHes a real broker would deliver, at the cost of a memcpy, so running the 1 -> 1
# scenario against it measures what the generator itself can send and count. It is only
# correct with a single publisher: chunks from several would interleave mid-packet.
# A subscriber whose write buffer fills pauses reading from the publishers (back-pressure).
# For the transports benchmark (bench/transports.py) it also listens over TLS (--certfile,
# --keyfile) and WebSockets (--websocket: websockets' sans-I/O server for the upgrade and
# the client's masked frames; each chunk forwarded as one binary frame, as Nautilus frames
# a loop turn's writes), so the generator's own capacity is measured over each transport.
from __future__ import annotations

import argparse
import asyncio
import ssl
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

CONNACK = b"\x20\x02\x00\x00"
SUBACK_HEAD = b"\x90\x03"


class _Pipes:
    def __init__(self) -> None:
        self.subscribers: set[asyncio.Transport] = set()
        self.publishers: set[asyncio.Transport] = set()


class _Connection(asyncio.Protocol):
    def __init__(self, pipes: _Pipes):
        self._pipes = pipes
        self._transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self._buf = bytearray()
        self._piping = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._pipes.subscribers.discard(self._transport)
        self._pipes.publishers.discard(self._transport)

    def pause_writing(self) -> None:
        for publisher in self._pipes.publishers:
            publisher.pause_reading()

    def resume_writing(self) -> None:
        for publisher in self._pipes.publishers:
            publisher.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._piping:
            for subscriber in self._pipes.subscribers:
                subscriber.write(data)
            return
        self._buf += data
        self._handshake()

    def _handshake(self) -> None:
        # Handshake packets are small: a single remaining-length byte is enough here.
        buf = self._buf
        while len(buf) >= 2 and len(buf) >= 2 + buf[1]:
            kind, end = buf[0] >> 4, 2 + buf[1]
            if kind == 1:  # CONNECT
                self._transport.write(CONNACK)
            elif kind == 8:  # SUBSCRIBE: grant the requested QoS of the first filter
                self._transport.write(SUBACK_HEAD + buf[2:4] + buf[end - 1 : end])
                self._pipes.subscribers.add(self._transport)
            elif kind == 3:  # first PUBLISH: from now on this connection is a pipe
                self._piping = True
                self._pipes.publishers.add(self._transport)
                self.data_received(bytes(buf))
                buf.clear()
                return
            del buf[:end]


class _WebSocket(asyncio.Protocol):
    """A WebSocket connection: the upgrade, then each data frame's payload to the pipe."""

    def __init__(self, inner: _Connection):
        self._inner = inner
        self._websocket = ServerProtocol(subprotocols=[Subprotocol("mqtt")], max_size=None)
        self._socket: asyncio.Transport = None  # type: ignore[assignment]  # connection_made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._socket = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        websocket = self._websocket
        websocket.receive_data(data)
        for event in websocket.events_received():
            if isinstance(event, Request):
                websocket.send_response(websocket.accept(event))
                if websocket.state is State.OPEN:
                    self._inner.connection_made(_Frames(self._socket))
            elif isinstance(event, Frame) and event.opcode in (Opcode.BINARY, Opcode.CONT):
                self._inner.data_received(bytes(event.data))
        for chunk in websocket.data_to_send():
            if chunk:
                self._socket.write(chunk)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _Frames(asyncio.Transport):
    """The pipe's side of a WebSocket: every write one (unmasked) binary frame."""

    def __init__(self, socket: asyncio.Transport):
        super().__init__()
        self._socket = socket

    def write(self, data: Any) -> None:
        length = len(data)
        if length < 126:
            head = bytes((0x82, length))
        elif length < 1 << 16:
            head = b"\x82\x7e" + length.to_bytes(2, "big")
        else:
            head = b"\x82\x7f" + length.to_bytes(8, "big")
        self._socket.writelines([head, data])

    def pause_reading(self) -> None:
        self._socket.pause_reading()

    def resume_reading(self) -> None:
        self._socket.resume_reading()


async def _serve(
    host: str, port: int, context: ssl.SSLContext | None = None, websocket: bool = False
) -> None:
    pipes = _Pipes()
    loop = asyncio.get_running_loop()

    def connection() -> asyncio.Protocol:
        return _WebSocket(_Connection(pipes)) if websocket else _Connection(pipes)

    server = await loop.create_server(connection, host, port, ssl=context)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="byte-pipe MQTT stand-in for calibration")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--certfile", help="TLS: the certificate chain (PEM)")
    parser.add_argument("--keyfile", help="TLS: its key (PEM)")
    parser.add_argument("--websocket", action="store_true", help="MQTT over WebSockets")
    args = parser.parse_args()
    context = None
    if args.certfile:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.certfile, args.keyfile)
    serve = _serve(args.host, args.port, context, args.websocket)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve)
    else:
        uvloop.run(serve)


if __name__ == "__main__":
    main()
