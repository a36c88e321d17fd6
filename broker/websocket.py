"""MQTT over WebSockets (`type = "ws"` / `"wss"` listeners), as browsers' clients (MQTT.js,
Paho JavaScript) speak it: an HTTP upgrade at the listener's `path` (default `/mqtt`)
with the `mqtt` subprotocol (`mqttv3.1` for old 3.1 clients), then MQTT's bytes carried
in binary frames.

The WebSocket protocol is the `websockets` library's sans-I/O `ServerProtocol`; this module
only moves bytes. `WebSocketProtocol` is the socket's asyncio protocol: it completes the
handshake, then unwraps each data frame into the MQTT `Connection`, which sees a
`WebSocketTransport`: its writes go out as one binary frame per flush, and reading,
pausing and the write buffer's flow control are the socket's own. So a WebSocket client
has the TCP listener's hot path and flow control, plus the framing.
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


class WebSocketTransport(asyncio.Transport):
    """What the MQTT Connection writes to: MQTT bytes in, binary frames out."""

    def __init__(self, socket: asyncio.Transport, websocket: ServerProtocol) -> None:
        super().__init__()
        self.socket = socket
        self.websocket = websocket
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
        self.socket.pause_reading()

    def resume_reading(self) -> None:
        self.socket.resume_reading()

    def is_reading(self) -> bool:
        return self.socket.is_reading()

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
        self.connection.connection_made(WebSocketTransport(self.socket, websocket))

    def _frame(self, frame: Frame) -> None:
        connection = self.connection
        if connection is None:
            return
        if frame.opcode in (OP_BINARY, OP_CONT):
            if frame.data:
                connection.data_received(bytes(frame.data))
        elif frame.opcode == OP_TEXT:  # MQTT travels in binary frames only [MQTT-6.0.0-1]
            log.info("%s: a text frame; closing", connection.client.name())
            self.websocket.fail(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
        # Ping, pong and close frames are answered by the protocol itself.

    def eof_received(self) -> bool | None:
        self.websocket.receive_eof()
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
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
