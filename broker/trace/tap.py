"""A traced connection: the packets it receives and sends, decoded, and what becomes of
it, written to the traces of its client.

Nothing of this is on an untraced connection's path. A traced one gets a tap: its engine
hands the tap each read before handling it (the engine's one check per read), and its
writer's transport is wrapped so that each write passes through the tap. The tap decodes
both directions with decoders of its own (the engine's takes packets out in runs it routes
at once; the writer sends pre-encoded bytes), so lines show what went over the wire, in
the order it went: a read's packets when they arrive, before what handling them did (its
hook calls), and a loop turn's answers when they are written, after it.

A tap made at CONNECT starts from the CONNECT the engine decoded, and the bytes that came
after it; one made for a client connected already starts at the first packet boundary
the engine has not decoded yet (packets decoded and held back by flow control are not
shown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.protocol import Connect, Decoder, Packet, ProtocolError
from broker.trace import text
from broker.trace.trace import RECV, SEND, SESSION

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.trace.trace import Trace


class Tap:
    def __init__(
        self, connection: Connection, traces: list[Trace], connect: Connect | None = None
    ) -> None:
        self.connection = connection
        self.traces = traces  # the traces of the client (the tracer's list: it changes)
        engine = connection.engine
        # CONNECT, being handled, says the level; the client's is not set yet.
        level = engine.client.protocol_level if connect is None else connect.protocol_level
        self._incoming: Decoder | None = Decoder(
            "server", level, max_packet_size=engine.decoder.max_packet_size
        )
        self._outgoing: Decoder | None = Decoder("client", level)
        writer = connection.writer
        self._transport = writer.transport
        writer.transport = TappedTransport(writer.transport, self)
        engine.tap = self  # attached before any line: one may end the trace (and detach)
        if connect is not None:
            self._write(RECV, connect)
        self.received(engine.decoder.pending())

    def received(self, data: bytes) -> None:
        self._incoming = self._decode(self._incoming, data, RECV)

    def sent(self, data: bytes) -> None:
        self._outgoing = self._decode(self._outgoing, data, SEND)

    def event(self, what: str) -> None:
        for trace in list(self.traces):
            trace.write(SESSION, what)

    def lost(self) -> None:
        self.event("connection closed")
        self.detach()

    def detach(self) -> None:
        """The trace is over for this connection: it reads and writes untraced again."""
        connection = self.connection
        if connection.engine.tap is self:
            connection.engine.tap = None
        writer = connection.writer
        if isinstance(writer.transport, TappedTransport) and writer.transport.tap is self:
            writer.transport = self._transport

    def _decode(self, decoder: Decoder | None, data: bytes, kind: str) -> Decoder | None:
        """Write the packets `data` completes; the decoder, or None once it lost track
        (the engine's own closes the connection for what breaks the protocol)."""
        if decoder is None or not data:
            return decoder
        decoder.receive_data(data)
        try:
            while (packet := decoder.next_packet()) is not None:
                self._write(kind, packet)
        except ProtocolError as exc:
            self.event(f"{kind}: undecodable ({exc}); its packets are no longer shown")
            return None
        return decoder

    def _write(self, kind: str, packet: Packet) -> None:
        for trace in list(self.traces):  # (a line may end a trace: its rate limit)
            trace.write(kind, text.packet(packet, trace.spec.trunc_payload))


class TappedTransport(asyncio.Transport):
    """A traced connection's transport, as its writer sees it: each write is shown to
    the tap first. (The writer writes, and aborts when the store fails; the rest of the
    transport is the connection's own.)"""

    def __init__(self, transport: asyncio.Transport, tap: Tap) -> None:
        super().__init__()
        self.transport = transport
        self.tap = tap

    def write(self, data: Any) -> None:
        self.tap.sent(bytes(data))
        self.transport.write(data)

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        chunks = list(list_of_data)
        self.tap.sent(b"".join(chunks))
        self.transport.writelines(chunks)

    def abort(self) -> None:
        self.transport.abort()
