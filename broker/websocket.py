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
from typing import TYPE_CHECKING, Any

from websockets.frames import OP_BINARY, OP_CONT, OP_TEXT, CloseCode, Frame
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from broker.connection import Connection

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("nautilus.connection")
# The library's own log ("connection open" per client at INFO): only its warnings.
_protocol_log = logging.getLogger("nautilus.websocket")
_protocol_log.setLevel(logging.WARNING)

SUBPROTOCOLS = [Subprotocol("mqtt"), Subprotocol("mqttv3.1")]
MIN_FRAME = 1024 * 1024  # the largest frame accepted is at least this (a packet, or several)
MAX_FEED = 64 * 1024  # bytes of MQTT handed to the Connection per loop turn


class WebSocketTransport(asyncio.Transport):
    """What the MQTT Connection writes to: MQTT bytes in, binary frames out."""

    def __init__(self, protocol: WebSocketProtocol, socket: asyncio.Transport) -> None:
        super().__init__()
        self.protocol = protocol
        self.socket = socket
        self.websocket = protocol.websocket
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.websocket.state is not State.OPEN:
            return  # closing (the client's close frame came): nothing more goes out
        self.websocket.send_binary(bytes(data))
        _send(self.socket, self.websocket)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))  # one frame per flush: MQTT frames need not align

    def can_write_eof(self) -> bool:
        return False  # a close frame ends the stream (see close)

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

    def abort(self) -> None:
        self._closing = True
        self.socket.abort()

    def is_closing(self) -> bool:
        return self._closing or self.socket.is_closing()

    def pause_reading(self) -> None:
        self.protocol.hold(True)

    def resume_reading(self) -> None:
        self.protocol.hold(False)

    def is_reading(self) -> bool:
        return not self.protocol.held

    def get_write_buffer_size(self) -> int:
        return self.socket.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.socket.get_extra_info(name, default)


class WebSocketProtocol(asyncio.Protocol):
    """A WebSocket listener's connection: the handshake, then frames <-> Connection."""

    def __init__(
        self, broker: Broker, make_connection: Callable[[], Connection], path: str
    ) -> None:
        self.broker = broker
        self.make_connection = make_connection
        self.path = path
        max_frame = max(broker.max_packet_size + 5, MIN_FRAME)
        self.websocket = ServerProtocol(
            subprotocols=SUBPROTOCOLS, max_size=max_frame, logger=_protocol_log
        )
        self.socket: asyncio.Transport | None = None
        self.connection: Connection | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.peer: tuple[str, int] | None = None  # a PROXY header's client
        self.held = False  # the Connection paused its reading (flow control)
        self._unread = bytearray()  # MQTT bytes of frames not handed over yet
        self._feed_due = False
        self._socket_reading = True

    def use_peer(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.socket = transport  # type: ignore[assignment]
        timeout = self.broker.settings.connect_timeout
        self.timer = self.broker.loop.call_later(timeout, self._give_up)

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
        self._stop_timer()
        websocket = self.websocket
        path = request.path.partition("?")[0]
        if path != self.path:
            response = websocket.reject(404, f"MQTT is served at {self.path}\n")
        else:
            response = websocket.accept(request)  # 400 without the mqtt subprotocol
        websocket.send_response(response)
        if websocket.state is not State.OPEN:
            peer = self.socket.get_extra_info("peername") if self.socket else None
            log.info("%s: WebSocket handshake refused: %s", peer, response.status_code)
            return
        assert self.socket is not None
        self.connection = self.make_connection()
        self.connection.connection_made(WebSocketTransport(self, self.socket))
        if self.peer is not None:
            self.connection.use_peer(self.peer)

    def _frame(self, frame: Frame) -> None:
        connection = self.connection
        if connection is None:
            return
        if frame.opcode in (OP_BINARY, OP_CONT):
            self._unread += frame.data  # handed over by _feed
        elif frame.opcode == OP_TEXT:  # MQTT travels in binary frames only [MQTT-6.0.0-1]
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
                self.broker.loop.call_soon(self._feed)
        self._update_reading()

    def hold(self, held: bool) -> None:
        """The Connection pauses or resumes its reading."""
        self.held = held
        if not held and self._unread and not self._feed_due:
            self._feed_due = True
            self.broker.loop.call_soon(self._feed)
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
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._unread.clear()
        if self.connection is not None:
            self.connection.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.connection is not None:
            self.connection.pause_writing()

    def resume_writing(self) -> None:
        if self.connection is not None:
            self.connection.resume_writing()

    def _give_up(self) -> None:
        if self.socket is not None and self.connection is None:
            log.info("%s: no WebSocket handshake in time", self.socket.get_extra_info("peername"))
            self.socket.close()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _send(socket: asyncio.Transport, websocket: ServerProtocol) -> None:
    """What the protocol has to send, to the socket (an empty chunk means: end the
    stream; the socket is closed by the caller or by connection_lost)."""
    for chunk in websocket.data_to_send():
        if chunk and not socket.is_closing():
            socket.write(chunk)
