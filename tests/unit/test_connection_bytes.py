"""The packet flows with bytes alone: a real Broker and real Connections on a fake loop and
fake transports, no socket, no thread, no waiting. Bytes go in through data_received;
what the broker writes is decoded from the transport; time moves only when the test
advances it (keepalive, will delay)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.config import config_from_dict
from broker.connection import Connection
from broker.protocol import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
    encode,
)
from broker.server import Broker

from .fakes import FakeLoop

V311, V5 = 4, 5


class FakeTransport:
    """What Connection uses of an asyncio transport; keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str) -> Any:
        return ("192.0.2.1", 50000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.written += chunk

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Wire:
    """One client's connection: send packets as bytes, read back what the broker wrote."""

    def __init__(self, broker: Broker, level: int = V311) -> None:
        self.broker = broker
        self.level = level
        self.transport = FakeTransport()
        self.connection = Connection(broker.connection_ports)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self._decoder = Decoder("client", level)
        self._read = 0

    def send(self, *packets: Packet) -> None:
        self.connection.data_received(b"".join(encode(p, self.level) for p in packets))
        self.broker.loop.advance(0)  # type: ignore[attr-defined]  # the flushes of this turn

    def received(self) -> list[Packet]:
        self._decoder.receive_data(bytes(self.transport.written[self._read :]))
        self._read = len(self.transport.written)
        packets = []
        while (packet := self._decoder.next_packet()) is not None:
            packets.append(packet)
        return packets

    def lose(self) -> None:
        """The socket is gone without DISCONNECT."""
        self.transport.closed = True
        self.connection.connection_lost(None)
        self.broker.loop.advance(0)  # type: ignore[attr-defined]


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def broker(loop) -> Broker:
    config = config_from_dict({"store": {"backend": "memory"}})
    broker = Broker(config, loop=loop, plugins=[])  # type: ignore[arg-type]
    broker.listening.append(("127.0.0.1", 1883))  # as if started: its one listener's
    return broker


def connected(broker: Broker, client_id: str, level: int = V311, **connect: Any) -> Wire:
    wire = Wire(broker, level)
    wire.send(Connect(client_id, level, **connect))
    (connack,) = wire.received()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    return wire


def test_connect_gets_its_connack_bytes(broker):
    wire = Wire(broker)
    wire.send(Connect("bytes", V311))
    assert bytes(wire.transport.written) == b"\x20\x02\x00\x00"


def test_a_packet_before_connect_closes_the_connection_without_an_answer(broker):
    wire = Wire(broker)
    wire.send(Subscribe(1, [Subscription("a", 0)]))
    assert wire.transport.closed
    assert wire.received() == []


def test_garbage_closes_only_that_connection(broker):
    good = connected(broker, "good")
    bad = Wire(broker)
    bad.connection.data_received(b"\x10\xff\xff\xff\xff\x7f")  # a length past 4 bytes
    assert bad.transport.closed and not good.transport.closed


def test_publish_goes_out_as_the_bytes_the_publisher_sent(broker):
    sub = connected(broker, "sub")
    sub.send(Subscribe(1, [Subscription("t/#", 1)]))
    assert sub.received() == [SubAck(1, [1])]
    pub = connected(broker, "pub")
    publish = Publish("t/x", b"hello", 1, False, False, 7)
    pub.send(publish)
    assert pub.received() == [PubAck(7)]
    (delivered,) = sub.received()
    assert isinstance(delivered, Publish)
    assert (delivered.topic, delivered.payload, delivered.qos) == ("t/x", b"hello", 1)
    assert bytes(sub.transport.written).endswith(
        encode(Publish("t/x", b"hello", 1, False, False, delivered.packet_id), V311)
    )


def test_keepalive_closes_a_silent_client_after_one_and_a_half_periods(broker, loop):
    wire = connected(broker, "quiet", keepalive=10)
    loop.advance(14.9)
    assert not wire.transport.closed
    loop.advance(0.2)
    assert wire.transport.closed
    assert broker.metrics.client_keepalive_expired == 1


def test_a_will_waits_for_its_delay_and_goes_to_its_subscribers(broker, loop):
    watcher = connected(broker, "watcher", V5)
    watcher.send(Subscribe(1, [Subscription("will/#", 0)]))
    watcher.received()
    will = Will("will/dying", b"gone", 0, False, {0x18: 5})  # Will Delay Interval 5 s
    dying = connected(broker, "dying", V5, will=will, properties={0x11: 60})
    dying.lose()
    loop.advance(4.9)
    assert watcher.received() == []
    loop.advance(0.2)
    (message,) = watcher.received()
    assert isinstance(message, Publish) and message.payload == b"gone"


def test_a_clean_disconnect_discards_the_will(broker, loop):
    watcher = connected(broker, "watcher")
    watcher.send(Subscribe(1, [Subscription("will/#", 0)]))
    watcher.received()
    leaving = connected(broker, "leaving", will=Will("will/x", b"no", 0, False))
    leaving.send(Disconnect())
    loop.advance(10)
    assert watcher.received() == []
