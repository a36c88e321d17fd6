"""Writer: one connection's outgoing bytes, batched per event-loop turn.

A client's outlet (broker/outlet.py): its session's deliveries and its engine's answers
are appended to a list and flushed with one `writelines` per loop turn, so a burst costs
one system call. When the transport's buffer passes its high-water mark, or the
unflushed bytes pass OUT_HIGH_WATER, `writable` turns false and deliveries wait in the
session's bounded queue until there is room (`resume`), when the session drains.

The flush keeps the store's promise: the turn's store batch is committed before the
bytes go out, and when they hold a PUBACK or PUBREC, the ingress is asked to keep what
they acknowledge (Ingress.kept: the store committed, and the plugins that keep something
before an acknowledgement have kept it) first.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Protocol

from broker.protocol import Packet, Property, encode

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.ingress import Ingress
    from broker.metrics import Metrics
    from broker.session import Session
    from broker.store import MessageStore

OUT_HIGH_WATER = 1024 * 1024  # unflushed bytes after which deliveries wait in the queue
# Nothing to write: one empty list shared by every idle writer (a write replaces it with a
# list of its own, and never appends to it), so an idle connection holds no list.
_NOTHING: list[bytes] = []
_PROBLEM_INFO = frozenset({Property.REASON_STRING, Property.USER_PROPERTY})


class TakesOver(Protocol):
    """The connection a writer writes for, which a takeover closes (broker/connection.py)."""

    def take_over(self) -> None: ...


class WriteSupport(Protocol):
    """What a writer uses of the broker."""

    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    store: MessageStore  # committed before a turn's bytes go out
    ingress: Ingress  # keeps the promise a PUBACK / PUBREC makes (Ingress.kept)


class Writer:
    __slots__ = (
        "_acked",
        "_out",
        "_out_bytes",
        "_paused",
        "client",
        "connection",
        "host",
        "session",
        "shut",
        "tls",
        "transport",
        "writable",
    )

    def __init__(self, host: WriteSupport, client: ClientState, connection: TakesOver) -> None:
        self.host = host
        self.client = client  # Outlet: the wire profile packets are encoded for
        self.connection = connection  # (itself, not a bound method: one object less)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.tls = False  # the transport encrypts (see flush)
        self.session: Session | None = None  # drained when there is room again
        self.writable = True  # Outlet: room for deliveries (see OUT_HIGH_WATER)
        self.shut = False  # nothing more goes out
        self._paused = False  # the transport's buffer is above its high-water mark
        self._out = _NOTHING
        self._out_bytes = 0
        self._acked = False  # PUBACK / PUBREC written since the last flush (store promises)

    # -- Outlet ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        out = self._out
        if out:
            out.append(data)
        else:
            self.host.loop.call_soon(self.flush)
            self._out = [data]
        self._out_bytes += len(data)
        if self._out_bytes >= OUT_HIGH_WATER:
            self.writable = False  # what comes next waits in the session's queue

    def send(self, packet: Packet) -> None:
        data = encode(packet, self.client.protocol_level)
        limit = self.client.max_packet_out
        if limit and len(data) > limit:
            data = self._without_problem_info(packet, data)
        self.write(data)

    def acknowledge(self, data: bytes) -> None:
        """Write a PUBACK / PUBREC: a promise that the message is stored (see flush)."""
        self._acked = True
        self.write(data)

    def take_over(self) -> None:
        self.connection.take_over()

    def _without_problem_info(self, packet: Packet, data: bytes) -> bytes:
        """A packet over the client's Maximum Packet Size loses its Reason String and User
        Properties, the parts the standard lets us leave out [MQTT-3.2.2-19/20, 3.4.2-2/3,
        3.14.2-3/4 and alike]. (PUBLISHes over the limit are dropped by the session.)"""
        props = getattr(packet, "properties", None)
        if not props or not (props.keys() & _PROBLEM_INFO):
            return data
        kept = {key: value for key, value in props.items() if key not in _PROBLEM_INFO}
        slimmer = dataclasses.replace(packet, properties=kept)  # type: ignore[arg-type]
        return encode(slimmer, self.client.protocol_level)

    # -- the transport -----------------------------------------------------------------

    def flush(self) -> None:
        out = self._out
        if out and not self.shut:
            host = self.host
            if not self._acked:
                host.store.commit()  # deliveries of stored messages: as they were stored
            elif not host.ingress.kept():  # a PUBACK goes out only after its message is kept
                # Not kept (a full disk): acknowledge nothing; the client resends what it
                # has not seen acknowledged.
                self.discard()
                self.transport.abort()
                return
            if self.tls:
                # One TLS record for the turn's packets: the TLS transport would make a
                # record (and an encryption call) of each item of a list.
                self.transport.write(b"".join(out))
            else:
                self.transport.writelines(out)  # one writev
            host.metrics.bytes_sent += self._out_bytes
        self.discard()
        self.writable = not self._paused
        session = self.session
        if session is not None and self.writable:
            queue = session.queue
            if queue.memory or session.held or queue.on_disk:
                session.drain()  # the next step of a long queue, one step per loop turn

    def discard(self) -> None:
        """Forget what is not written yet."""
        self._out = _NOTHING
        self._out_bytes = 0
        self._acked = False

    def pause(self) -> None:
        """The transport's buffer is full (asyncio's pause_writing)."""
        self._paused = True
        self.writable = False

    def resume(self) -> None:
        """The transport's buffer has room again: the session drains."""
        self._paused = False
        self.writable = self._out_bytes < OUT_HIGH_WATER
        if self.session is not None:
            self.session.drain()
