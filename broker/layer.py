"""What the layers between a socket and the MQTT Connection share: TLS after a PROXY
header (broker/tls_stream.py) and WebSocket framing (broker/websocket.py).

A `Layer` is the socket's protocol: it runs its handshake within `connect_timeout`, then
passes bytes up to the protocol above it (`upper`) and the socket's write-buffer signals
with them. The protocol above writes to a `LayerTransport`, whose writes the layer wraps
(a TLS record, a binary frame: one per write, the Connection writing once per loop turn)
and whose reading, write buffer and closing are the socket's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("nautilus.connection")


class Layer(asyncio.Protocol):
    name = "layer"  # in logs: "no <name> handshake in time"

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.socket: asyncio.Transport | None = None
        self.upper: asyncio.Protocol | None = None  # once the handshake is done
        self.peer: tuple[str, int] | None = None  # a PROXY header's client, for the upper
        self._timer: asyncio.TimerHandle | None = None

    def use_peer(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.socket = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self._timer = self.loop.call_later(self.timeout, self._give_up)

    def hand_up(self, upper: asyncio.Protocol, transport: asyncio.Transport) -> None:
        """The handshake is done: `upper` gets the connection (and the peer, if known)."""
        self._stop_timer()
        self.upper = upper
        upper.connection_made(transport)
        if self.peer is not None:
            upper.use_peer(self.peer)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return None  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self.upper is not None:
            self.upper.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.upper is not None:
            self.upper.pause_writing()

    def resume_writing(self) -> None:
        if self.upper is not None:
            self.upper.resume_writing()

    def _give_up(self) -> None:
        if self.socket is not None and self.upper is None:
            peer = self.socket.get_extra_info("peername")
            log.info("%s: no %s handshake in time", peer, self.name)
            self.socket.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class LayerTransport(asyncio.Transport):
    """The transport of the protocol above a layer; subclasses say how a write is wrapped."""

    def __init__(self, socket: asyncio.Transport) -> None:
        super().__init__()
        self.socket = socket
        self._closing = False

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))  # one record or frame for the loop turn

    def can_write_eof(self) -> bool:
        return False  # the layer's own end (close_notify, a close frame) ends the stream

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

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.socket.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.socket.get_extra_info(name, default)
