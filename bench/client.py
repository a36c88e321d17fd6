# One raw MQTT 3.1.1 client connection of the load generator.
#
# Strategy: the hot path never decodes packets one at a time. After the handshake, a
# benchmark connection receives long runs of identical packets: the same PUBLISH (same
# topic, flags and size) on a subscriber, the same 4-byte PUBACK on a QoS 1 publisher.
# - QoS 0 deliveries are byte-identical, so a chunk that is nothing but whole copies is
#   counted with one `bytes.count`.
# - Otherwise the fixed-header bytes of every whole packet in the buffer are checked with
#   extended slices, which run in C: if each packet starts where the stride says and
#   carries the expected header, the buffer is a run of copies and counting is a
#   division. QoS 1 deliveries are acked the same way: the packet id columns are sliced
#   out and interleaved into PUBACKs.
# - Anything else (CONNACK, SUBACK, a PUBLISH of another shape, timestamped latency
#   probes) goes through a small per-packet parser.
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.protocol import PacketType, PubAck, encode

from . import packets

if TYPE_CHECKING:
    from .client_layers import Transport

_WRITE_HIGH_WATER = 256 * 1024


@dataclass(frozen=True, slots=True)
class Uniform:
    """The wire form of the packet expected to repeat on a connection."""

    header: bytes  # fixed header: type/flags byte + remaining-length varint
    size: int  # whole packet length, the stride between packets
    id_offset: int | None = None  # packet id position of a QoS 1 PUBLISH
    wire: bytes | None = None  # the whole packet, when every copy is byte-identical

    @classmethod
    def publish(cls, topic: str, payload: bytes, qos: int) -> Uniform:
        """A PUBLISH as a broker delivers it to a subscriber granted `qos`."""
        if qos:
            packet = packets.publish(topic, payload, qos, packet_id=1)
            return cls._of(packet, packets.packet_id_offset(packet))
        packet = packets.publish(topic, payload)
        return cls._of(packet, wire=packet)

    @classmethod
    def puback(cls) -> Uniform:
        return cls._of(encode(PubAck(1), packets.MQTT_311))

    @classmethod
    def _of(cls, packet: bytes, id_offset: int | None = None, wire: bytes | None = None) -> Uniform:
        return cls(packet[: packets.header_length(packet)], len(packet), id_offset, wire)

    @property
    def is_puback(self) -> bool:
        return self.header[0] >> 4 == PacketType.PUBACK


class MqttClient(asyncio.Protocol):
    """A connection that counts deliveries and acks, and acks QoS 1 deliveries itself."""

    def __init__(self, uniform: Uniform | None = None, latencies: list[int] | None = None):
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[int | None] = loop.create_future()
        self.suback: asyncio.Future[bytes | None] = loop.create_future()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.received = 0  # PUBLISH packets delivered to this client
        self.acked = 0  # PUBACKs received for this client's QoS 1 PUBLISHes
        self.paused = False  # the transport's write buffer is above its high-water mark
        self.on_ack: Callable[[], None] | None = None
        self.on_writable: Callable[[], None] | None = None
        self.on_delivery: Callable[[], None] | None = None
        # Called with (topic, payload) for each PUBLISH the per-packet parser reads.
        self.on_message: Callable[[bytes, bytes], None] | None = None
        # When a list is given, each PUBLISH payload starts with a perf_counter_ns stamp.
        self.latencies = latencies
        self._uniform = uniform
        self._buf = bytearray()

    def read_in_bulk(self, low_water: int) -> None:
        """Only wake up for reading once `low_water` bytes are waiting (SO_RCVLOWAT).

        A broker that writes each packet on its own would otherwise cost a wake-up and a
        recv() per packet, CPU the broker's core then loses to the generator. The mark
        must stay below what the broker sends before it waits for this client.
        """
        sock = self.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, low_water)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)

    def connection_lost(self, exc: Exception | None) -> None:
        # None tells a waiter the broker closed the connection; an exception would be
        # reported as never retrieved on the futures nobody awaits.
        for waiter in (self.connack, self.suback):
            if not waiter.done():
                waiter.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_writable is not None:
            self.on_writable()

    def data_received(self, data: bytes) -> None:
        received = self.received
        self._consume(data)
        if self.on_delivery is not None and self.received != received:
            self.on_delivery()

    def _consume(self, data: bytes) -> None:
        buf = self._buf
        uniform = self._uniform
        if not buf and uniform is not None and uniform.wire is not None:
            # QoS 0 deliveries are byte-identical: k non-overlapping copies that fill the
            # chunk exactly must tile it, so one C-level count settles the common case.
            count = data.count(uniform.wire)
            if count * uniform.size == len(data):
                self.received += count
                return
        buf += data
        if uniform is not None:
            self._take_uniform(buf, uniform)
        if buf:
            self._parse(buf)

    # fast path

    def _take_uniform(self, buf: bytearray, uniform: Uniform) -> None:
        size = uniform.size
        count = len(buf) // size
        end = count * size
        if not count:
            return
        # Header byte i of every packet sits in column i of the stride.
        for i, byte in enumerate(uniform.header):
            if buf[i:end:size].count(byte) != count:
                return  # not a pure run: the per-packet parser takes over
        if uniform.is_puback:
            self.acked += count
            if self.on_ack is not None:
                self.on_ack()
        else:
            self.received += count
            if uniform.id_offset is not None:
                self._ack_run(buf, count, end, uniform)
        del buf[:end]

    def _ack_run(self, buf: bytearray, count: int, end: int, uniform: Uniform) -> None:
        assert uniform.id_offset is not None  # a QoS 1 run: the caller checked
        acks = bytearray(4 * count)
        acks[0::4] = packets.PUBACK_HEAD[:1] * count
        acks[1::4] = packets.PUBACK_HEAD[1:] * count
        acks[2::4] = buf[uniform.id_offset : end : uniform.size]
        acks[3::4] = buf[uniform.id_offset + 1 : end : uniform.size]
        self.transport.write(acks)

    # slow path

    def _parse(self, buf: bytearray) -> None:
        pos, end = 0, len(buf)
        while (head := _fixed_header(buf, pos, end)) is not None:
            start, length = head
            if start + length > end:
                break
            self._packet(buf[pos], bytes(buf[start : start + length]))
            pos = start + length
        del buf[:pos]

    def _packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == PacketType.PUBLISH:
            self._publish((first >> 1) & 3, body)
        elif kind == PacketType.PUBACK:
            self.acked += 1
            if self.on_ack is not None:
                self.on_ack()
        elif kind == PacketType.CONNACK and not self.connack.done():
            self.connack.set_result(body[1])  # the 3.1.1 connect return code
        elif kind == PacketType.SUBACK and not self.suback.done():
            self.suback.set_result(body[2:])  # granted QoS per filter
        # PINGRESP, UNSUBACK, ...: nothing the generator needs.

    def _publish(self, qos: int, body: bytes) -> None:
        self.received += 1
        topic_end = start = 2 + int.from_bytes(body[:2], "big")  # after the topic
        if qos:
            self.transport.write(packets.PUBACK_HEAD + body[start : start + 2])
            start += 2
        if self.latencies is not None:
            sent = int.from_bytes(body[start : start + 8], "big")
            self.latencies.append(time.perf_counter_ns() - sent)
        if self.on_message is not None:
            self.on_message(body[2:topic_end], body[start:])


def _fixed_header(buf: bytearray, pos: int, end: int) -> tuple[int, int] | None:
    """(body start, remaining length) of the packet at `pos`, or None if incomplete."""
    length, shift, i = 0, 0, pos + 1
    while i < end:
        byte = buf[i]
        i += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return i, length
        shift += 7
    return None


@dataclass(frozen=True, slots=True)
class Login:
    """A username and password for a broker that refuses anonymous clients."""

    username: str
    password: str


async def open_client(
    host: str,
    port: int,
    client_id: str,
    *,
    uniform: Uniform | None = None,
    latencies: list[int] | None = None,
    timeout: float = 10.0,
    clean_session: bool = True,
    keepalive: int = 0,
    transport: Transport | None = None,
    login: Login | None = None,
) -> MqttClient:
    """Connect, send CONNECT and wait for a successful CONNACK. `transport`: TLS or
    WebSockets (bench/client_layers.py) instead of plain TCP; `login`: the CONNECT's
    username and password (None: anonymous)."""
    if transport is None:
        loop = asyncio.get_running_loop()
        _, client = await asyncio.wait_for(
            loop.create_connection(lambda: MqttClient(uniform, latencies), host, port), timeout
        )
    else:
        client = MqttClient(uniform, latencies)
        await asyncio.wait_for(transport.connect(client, host, port), timeout)
    username, password = (None, None) if login is None else (login.username, login.password)
    client.transport.write(
        packets.connect(
            client_id, keepalive, clean_session=clean_session, username=username, password=password
        )
    )
    try:
        code = await asyncio.wait_for(client.connack, timeout)
    except BaseException:
        client.transport.abort()
        raise
    if code is None:
        raise ConnectionError("connection closed before CONNACK")
    if code:
        client.transport.abort()
        raise ConnectionError(f"CONNACK return code {code}")
    return client


async def subscribe(client: MqttClient, topic_filter: str, qos: int, timeout: float = 10.0) -> None:
    """Subscribe to one filter and wait for a SUBACK granting it."""
    if client.suback.done():  # a further SUBSCRIBE on this connection
        client.suback = asyncio.get_running_loop().create_future()
    client.transport.write(packets.subscribe(topic_filter, qos))
    granted = await asyncio.wait_for(client.suback, timeout)
    if granted is None:
        raise ConnectionError("connection closed before SUBACK")
    if not granted or granted[0] >= 0x80:
        raise ConnectionError(f"SUBSCRIBE {topic_filter!r} refused: {granted.hex()}")
