# The clients of the clustering benchmark (bench/cluster.py) that bench/client.py and
# bench/loadgen.py do not have: a subscriber that stamps its SUBACKs and first deliveries
# (subscription propagation), a 1 ms ticker publishing to a topic until told to stop, a
# QoS 1 publisher of a fixed number of numbered messages, and a receiver that checks a
# numbered stream arrived exactly once (queue migration).
#
# Strategy: all are MqttClient (bench/client.py) underneath, so the handshake, the
# per-packet parser and the bulk counting and acking of uniform runs are the ones every
# other benchmark uses. The numbered messages carry their number in the first 4 payload
# bytes; the receiver reads the numbers of a uniform run with strided slices (C speed),
# so a million-message queue costs the generator no per-packet parsing.
from __future__ import annotations

import asyncio
import sys
import time
from array import array
from collections.abc import Callable
from typing import TypeVar

from broker.protocol import PacketType, Unsubscribe, encode

from . import packets
from .client import MqttClient, Uniform

C = TypeVar("C", bound=MqttClient)
SEQ_BYTES = 4  # the message number, big-endian, at the start of the payload


async def connect(
    factory: Callable[[], C],
    host: str,
    port: int,
    client_id: str,
    *,
    clean_session: bool = True,
    timeout: float = 10.0,
) -> tuple[C, float]:
    """A connected client made by `factory`, and the seconds from writing its CONNECT to
    reading its CONNACK (successful; raises ConnectionError otherwise). A client with a
    `connack_at` stamps the CONNACK as it is parsed, before the deliveries read with it."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(factory, host, port), timeout)
    sent = time.perf_counter()
    client.transport.write(packets.connect(client_id, clean_session=clean_session))
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
    return client, (getattr(client, "connack_at", 0.0) or time.perf_counter()) - sent


class Prober(MqttClient):
    """A subscriber that knows when each SUBACK arrived (monotonic ns), calls
    `on_suback` the moment it does, and waits for UNSUBACKs."""

    def __init__(self) -> None:
        super().__init__()
        self.suback_ns = 0
        self.on_suback: Callable[[], None] | None = None
        self.unsuback: asyncio.Future[None] | None = None
        self.session_present = False
        self._packet_id = 0

    def _packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == PacketType.SUBACK:
            self.suback_ns = time.monotonic_ns()
            if self.on_suback is not None:
                self.on_suback()
        elif kind == PacketType.UNSUBACK:
            if self.unsuback is not None and not self.unsuback.done():
                self.unsuback.set_result(None)
        elif kind == PacketType.CONNACK:
            self.session_present = bool(body[0] & 1)
        super()._packet(first, body)

    def next_id(self) -> int:
        self._packet_id = self._packet_id % packets.MAX_PACKET_ID + 1
        return self._packet_id

    def send_subscribe(self, topic_filter: str, qos: int = 0) -> asyncio.Future[bytes | None]:
        """Write a SUBSCRIBE; the future is its SUBACK's granted QoS bytes."""
        self.suback = asyncio.get_running_loop().create_future()
        self.transport.write(packets.subscribe(topic_filter, qos, self.next_id()))
        return self.suback

    async def unsubscribe(self, topic_filter: str, timeout: float = 10.0) -> None:
        self.unsuback = asyncio.get_running_loop().create_future()
        packet = Unsubscribe(self.next_id(), [topic_filter])
        self.transport.write(encode(packet, packets.MQTT_311))
        await asyncio.wait_for(self.unsuback, timeout)


class Ticker:
    """Writes one pre-encoded QoS 0 PUBLISH every `interval` seconds from start() until
    stop() (loop timers: about 1 ms apart at best)."""

    def __init__(self, client: MqttClient, packet: bytes, interval: float = 0.001) -> None:
        self._client = client
        self._packet = packet
        self._interval = interval
        self._timer: asyncio.TimerHandle | None = None
        self._running = False
        self.sent = 0

    def start(self) -> None:
        self._running = True
        self._tick()

    def stop(self) -> None:
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        if not self._running or self._client.transport.is_closing():
            return
        self._client.transport.write(self._packet)
        self.sent += 1
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)


class Numbered:
    """QoS 1 publisher of messages 0 .. count-1 (the number in the payload), keeping at
    most `window` unacknowledged; `done` resolves once every one was acknowledged."""

    def __init__(
        self, client: MqttClient, topic: str, count: int, size: int = 16, window: int = 100
    ) -> None:
        size = max(size, SEQ_BYTES)
        template = packets.publish(topic, bytes(size), qos=1, packet_id=1)
        self._head = template[: packets.packet_id_offset(template)]
        self._padding = bytes(size - SEQ_BYTES)
        self._client = client
        self._count = count
        self._window = window
        self.sent = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        client.on_ack = self._pump

    def start(self) -> None:
        self._pump()

    def _pump(self) -> None:
        client = self._client
        if client.acked >= self._count:
            if not self.done.done():
                self.done.set_result(None)
            return
        room = min(self._window - (self.sent - client.acked), self._count - self.sent)
        if room <= 0 or client.transport.is_closing():
            return
        head, padding, first = self._head, self._padding, self.sent
        client.transport.writelines(
            [
                head
                + (n % packets.MAX_PACKET_ID + 1).to_bytes(2, "big")
                + n.to_bytes(SEQ_BYTES, "big")
                + padding
                for n in range(first, first + room)
            ]
        )
        self.sent += room


class NumberedReceiver(MqttClient):
    """A QoS 1 subscriber (it acks every delivery) counting which of messages
    0 .. count-1 it received, how many more than once, and how many out of order."""

    def __init__(self, topic: str, count: int, size: int = 16) -> None:
        uniform = Uniform.publish(topic, bytes(max(size, SEQ_BYTES)), 1)
        super().__init__(uniform)
        assert uniform.id_offset is not None
        self._seq_at = uniform.id_offset + 2  # the payload follows the packet id
        self.seen = bytearray(count)
        self.distinct = 0
        self.duplicates = 0
        self.strays = 0  # numbers outside 0 .. count-1, or payloads too short
        self.out_of_order = 0  # deliveries with a number below one received before
        self.session_present = False
        self.connack_at = 0.0  # perf_counter when the CONNACK was parsed
        self.first_at = 0.0  # perf_counter of the first delivery
        self.last_new_at = 0.0  # perf_counter of the last delivery never seen before
        self._highest = -1
        self.on_message = self._numbered

    def _packet(self, first: int, body: bytes) -> None:
        if first >> 4 == PacketType.CONNACK:
            self.connack_at = time.perf_counter()
            self.session_present = bool(body[0] & 1)
        super()._packet(first, body)

    def _numbered(self, topic: bytes, payload: bytes) -> None:
        """Per-packet path (the parser): one delivery."""
        if len(payload) < SEQ_BYTES:
            self.strays += 1
            return
        self._record([int.from_bytes(payload[:SEQ_BYTES], "big")])

    def _take_uniform(self, buf: bytearray, uniform: Uniform) -> None:
        """MqttClient's bulk path, also reading the run's numbers with strided slices."""
        size = uniform.size
        count = len(buf) // size
        end = count * size
        if not count:
            return
        for i, byte in enumerate(uniform.header):
            if buf[i:end:size].count(byte) != count:
                return  # not a pure run: the per-packet parser takes over
        column = bytearray(SEQ_BYTES * count)
        at = self._seq_at
        for k in range(SEQ_BYTES):
            column[k::SEQ_BYTES] = buf[at + k : end : size]
        numbers = array("I")
        assert numbers.itemsize == SEQ_BYTES
        numbers.frombytes(column)
        if sys.byteorder == "little":
            numbers.byteswap()
        self.received += count
        self._ack_run(buf, count, end, uniform)
        del buf[:end]
        self._record(numbers)

    def _record(self, numbers: list[int] | array[int]) -> None:
        now = time.perf_counter()
        if not self.first_at:
            self.first_at = now
        seen, total, highest = self.seen, len(self.seen), self._highest
        new = 0
        for n in numbers:
            if n >= total:
                self.strays += 1
                continue
            if n < highest:
                self.out_of_order += 1
            else:
                highest = n
            if seen[n]:
                self.duplicates += 1
            else:
                seen[n] = 1
                new += 1
        self._highest = highest
        if new:
            self.distinct += new
            self.last_new_at = now

    def missing(self) -> int:
        return len(self.seen) - self.distinct
