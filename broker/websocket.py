"""MQTT over WebSockets (`type = "ws"` / `"wss"` listeners), as browsers' clients (MQTT.js,
Paho JavaScript) speak it: an HTTP upgrade at the listener's `path` (default `/mqtt`)
with the `mqtt` subprotocol (`mqttv3.1` for old 3.1 clients), then MQTT's bytes carried
in binary frames.

The WebSocket protocol is the `websockets` library's sans-I/O `ServerProtocol`; this module
only moves bytes. `WebSocketProtocol` is the socket's asyncio protocol: it completes the
handshake, then unwraps each data frame into the MQTT `Connection`, which sees a
`WebSocketTransport`: its writes go out as one binary frame per flush, and the write
buffer's flow control is the socket's own. So a WebSocket client has the TCP listener's
hot path and flow control, plus the framing.

Reading: a frame arrives whole (the library yields complete frames), and a client may put
thousands of packets in one. It is handed to the Connection at most MAX_FEED bytes per
loop turn, as a TCP read would bring them, so that one turn does not route so much that
subscribers' deliveries pass their unflushed high-water mark and go through their queues.
While bytes wait, or while the Connection holds its reading (flow control), the socket is
not read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from broker.connection import Connection
from broker.layer import Layer, LayerTransport

log = logging.getLogger("nautilus.connection")
# The library's own log ("connection open" per client at INFO): only its warnings.
_protocol_log = logging.getLogger("nautilus.websocket")
_protocol_log.setLevel(logging.WARNING)

SUBPROTOCOLS = [Subprotocol("mqtt"), Subprotocol("mqttv3.1")]
MIN_FRAME = 1024 * 1024  # the largest frame accepted is at least this (a packet, or several)
MAX_FEED = 64 * 1024  # bytes of MQTT handed to the Connection per loop turn


class WebSocketTransport(LayerTransport):
    """What the MQTT Connection writes to: MQTT bytes in, binary frames out."""

    def __init__(self, protocol: WebSocketProtocol, socket: asyncio.Transport) -> None:
        super().__init__(socket)
        self.protocol = protocol
        self.websocket = protocol.websocket

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.websocket.state is not State.OPEN:
            return  # closing (the client's close frame came): nothing more goes out
        self.websocket.send_binary(bytes(data))
        _send(self.socket, self.websocket)

    def close(self) -> None:
        """The closing handshake: our close frame now, the socket closed once it is out
        (the client's close frame, if it answers, is not waited for)."""
        if self._closing:
            return
        self._closing = True
        if self.websocket.state is State.OPEN:
            self.websocket.send_close(CloseCode.NORMAL_CLOSURE)
            _send(self.socket, self.websocket)
        self.socket.close()

    # Reading is the protocol's: it holds frames' bytes back as well as the socket.
    def pause_reading(self) -> None:
        self.protocol.hold(True)

    def resume_reading(self) -> None:
        self.protocol.hold(False)

    def is_reading(self) -> bool:
        return not self.protocol.held


class WebSocketProtocol(Layer):
    """A WebSocket listener's connection: the handshake, then frames <-> Connection."""

    name = "WebSocket"

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        max_packet_size: int,
        make_connection: Callable[[], Connection],
        path: str,
    ) -> None:
        """`timeout`: seconds the handshake may take (connect_timeout)."""
        super().__init__(loop, timeout)
        self.make_connection = make_connection
        self.path = path
        max_frame = max(max_packet_size + 5, MIN_FRAME)
        self.websocket = ServerProtocol(
            subprotocols=SUBPROTOCOLS, max_size=max_frame, logger=_protocol_log
        )
        self.connection: Connection | None = None  # the upper protocol, once upgraded
        self.held = False  # the Connection paused its reading (flow control)
        self._unread = bytearray()  # MQTT bytes of frames not handed over yet
        self._feed_due = False
        self._socket_reading = True

    def data_received(self, data: bytes) -> None:
        websocket = self.websocket
        websocket.receive_data(data)
        for event in websocket.events_received():
            if isinstance(event, Frame):
                self._frame(event)
            elif isinstance(event, Request):
                self._handshake(event)
        assert self.socket is not None
        _send(self.socket, websocket)
        if websocket.close_expected():  # a refused handshake, or a closing handshake
            self.socket.close()
        elif self._unread and not self._feed_due:
            self._feed()

    def _handshake(self, request: Request) -> None:
        websocket = self.websocket
        path = request.path.partition("?")[0]
        if path != self.path:
            response = websocket.reject(404, f"MQTT is served at {self.path}\n")
        else:
            response = websocket.accept(request)  # 400 without the mqtt subprotocol
        websocket.send_response(response)
        assert self.socket is not None
        if websocket.state is not State.OPEN:
            self._stop_timer()
            peer = self.socket.get_extra_info("peername")
            log.info("%s: WebSocket handshake refused: %s", peer, response.status_code)
            return
        self.connection = self.make_connection()
        self.hand_up(self.connection, WebSocketTransport(self, self.socket))

    def _frame(self, frame: Frame) -> None:
        connection = self.connection
        if connection is None:
            return
        if frame.opcode in (Opcode.BINARY, Opcode.CONT):
            self._unread += frame.data  # handed over by _feed
        elif frame.opcode == Opcode.TEXT:  # MQTT travels in binary frames only [MQTT-6.0.0-1]
            log.info("%s: a text frame; closing", connection.client.name())
            self.websocket.fail(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
        # Ping, pong and close frames are answered by the protocol itself.

    def _feed(self) -> None:
        """Hand the Connection the next MAX_FEED bytes; the rest next turn."""
        self._feed_due = False
        connection = self.connection
        if connection is not None and self._unread and not self.held:
            chunk = bytes(self._unread[:MAX_FEED])
            del self._unread[:MAX_FEED]
            connection.data_received(chunk)
            if self._unread and not self.held:
                self._feed_due = True
                self.loop.call_soon(self._feed)
        self._update_reading()

    def hold(self, held: bool) -> None:
        """The Connection pauses or resumes its reading."""
        self.held = held
        if not held and self._unread and not self._feed_due:
            self._feed_due = True
            self.loop.call_soon(self._feed)
        self._update_reading()

    def _update_reading(self) -> None:
        """The socket is read while nothing waits to be handed over and nothing is held."""
        wanted = not self.held and not self._unread
        if wanted != self._socket_reading and self.socket is not None:
            self._socket_reading = wanted
            if wanted:
                self.socket.resume_reading()
            else:
                self.socket.pause_reading()

    def eof_received(self) -> bool | None:
        self.websocket.receive_eof()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._unread.clear()
        super().connection_lost(exc)


def _send(socket: asyncio.Transport, websocket: ServerProtocol) -> None:
    """What the protocol has to send, to the socket (an empty chunk means: end the
    stream; the socket is closed by the caller or by connection_lost)."""
    for chunk in websocket.data_to_send():
        if chunk and not socket.is_closing():
            socket.write(chunk)
