"""PUBLISH at QoS 0, 1 and 2 in both directions; packet ids; in-flight windows."""

from __future__ import annotations

import pytest

from .helpers import (
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RECEIVE_MAXIMUM,
    V5,
    V311,
    VERSIONS,
    ack_packet,
    publish_packet,
    unique_id,
)

NO_MATCHING_SUBSCRIBERS = 0x10


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivered_qos_is_min_of_publish_and_granted(
    broker, paho_client, version, pub_qos, sub_qos
):
    sub = paho_client(broker, version)
    assert sub.subscribe("qos/t", sub_qos) == [sub_qos]
    pub = paho_client(broker, version)
    pub.publish("qos/t", b"payload", qos=pub_qos)  # waits for PUBACK / PUBCOMP
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("qos/t", b"payload", min(pub_qos, sub_qos))
    assert msg.retain is False


@pytest.mark.parametrize("version", VERSIONS)
def test_messages_from_one_publisher_arrive_in_order(broker, paho_client, version):
    sub = paho_client(broker, version)
    sub.subscribe("order/t", 1)
    pub = paho_client(broker, version)
    for i in range(100):
        pub.client.publish("order/t", str(i).encode(), 1)
    pub.publish("order/t", b"end", qos=1)
    got = [m.payload for m in sub.collect_until(b"end")]
    assert got == [str(i).encode() for i in range(100)] + [b"end"]


@pytest.mark.parametrize("version", VERSIONS)
def test_large_payload(broker, paho_client, version):
    sub = paho_client(broker, version)
    sub.subscribe("big/t", 1)
    pub = paho_client(broker, version)
    payload = bytes(range(256)) * 1024  # 256 KiB, a 3-byte remaining length
    pub.publish("big/t", payload, qos=1)
    assert sub.expect_message().payload == payload


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_publish_gets_puback_with_its_packet_id(broker, raw_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    raw.send(publish_packet("ack/t", b"x", qos=1, packet_id=4242, version=version))
    ack = raw.expect(PUBACK)
    assert ack.packet_id == 4242
    assert ack.reason_code in (0, NO_MATCHING_SUBSCRIBERS)


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_inbound_flow_and_exactly_once(broker, raw_client, paho_client, version):
    # [MQTT-4.3.3-2]: until PUBREL, a re-sent PUBLISH with the same packet id gets PUBREC
    # again and must not be forwarded a second time.
    sub = paho_client(broker, version)
    sub.subscribe("once/t", 2)
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    raw.send(publish_packet("once/t", b"one", qos=2, packet_id=77, version=version))
    assert raw.expect(PUBREC).packet_id == 77
    raw.send(publish_packet("once/t", b"one", qos=2, packet_id=77, dup=True, version=version))
    assert raw.expect(PUBREC).packet_id == 77
    raw.send(ack_packet(PUBREL, 77))
    assert raw.expect(PUBCOMP).packet_id == 77
    raw.publish("once/t", b"sentinel", qos=2)
    got = sub.collect_until(b"sentinel")
    assert [(m.payload, m.qos) for m in got] == [(b"one", 2), (b"sentinel", 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_outbound_flow(broker, raw_client, paho_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    raw.subscribe(("out2/t", 2))
    pub = paho_client(broker, version)
    pub.publish("out2/t", b"x", qos=2)
    msg = raw.expect(PUBLISH)
    assert (msg.qos, msg.dup) == (2, False)
    assert msg.packet_id
    raw.send(ack_packet(PUBREC, msg.packet_id))
    rel = raw.expect(PUBREL)
    assert (rel.packet_id, rel.flags) == (msg.packet_id, 0x02)  # [MQTT-3.6.1-1]
    raw.send(ack_packet(PUBCOMP, msg.packet_id))
    assert raw.is_open()


@pytest.mark.parametrize("version", VERSIONS)
def test_broker_packet_ids_are_nonzero_and_distinct_in_flight(
    broker, raw_client, paho_client, version
):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    raw.subscribe(("ids/t", 1), ("ids/zero", 0))
    pub = paho_client(broker, version)
    for i in range(5):
        pub.publish("ids/t", str(i).encode(), qos=1)
    pkts = [raw.expect(PUBLISH) for _ in range(5)]
    ids = [p.packet_id for p in pkts]
    assert all(ids) and len(set(ids)) == 5, ids
    assert [p.payload for p in pkts] == [b"0", b"1", b"2", b"3", b"4"]
    for p in pkts:
        raw.ack(p)
    pub.publish("ids/zero", b"qos0", qos=1)
    zero = raw.expect(PUBLISH)
    # A QoS 0 PUBLISH has no packet identifier [MQTT-2.3.1-5]: topic then payload.
    props = b"\x00" if version == V5 else b""  # (an empty property list in 5.0)
    assert (zero.qos, zero.packet_id, zero.body) == (0, None, b"\x00\x08ids/zero" + props + b"qos0")


@pytest.mark.parametrize("version", VERSIONS)
def test_max_inflight_messages_window(start_broker, raw_client, paho_client, version):
    server = start_broker(broker={"max_inflight_messages": 2})
    raw = raw_client(server, version)
    raw.connect(unique_id(), version=version)
    raw.subscribe(("win/t", 1))
    pub = paho_client(server, version)
    for i in range(1, 6):
        pub.publish("win/t", str(i).encode(), qos=1)
    first, second = raw.expect(PUBLISH), raw.expect(PUBLISH)
    assert [first.payload, second.payload] == [b"1", b"2"]
    raw.expect_silence()  # the window is full
    raw.ack(first)
    assert raw.expect(PUBLISH).payload == b"3"
    raw.expect_silence()
    raw.ack(second)
    assert raw.expect(PUBLISH).payload == b"4"


def test_v5_receive_maximum_limits_unacked_messages(broker, raw_client, paho_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id(), properties={RECEIVE_MAXIMUM: 1})
    raw.subscribe(("rm/t", 2))
    pub = paho_client(broker, V5)
    pub.publish("rm/t", b"1", qos=1)
    pub.publish("rm/t", b"2", qos=2)
    pub.publish("rm/t", b"3", qos=1)
    one = raw.expect(PUBLISH)
    assert one.payload == b"1"
    raw.expect_silence()
    raw.ack(one)
    two = raw.expect(PUBLISH)
    assert (two.payload, two.qos) == (b"2", 2)
    # A QoS 2 message counts until its PUBCOMP [MQTT-4.9.0-2].
    raw.send(ack_packet(PUBREC, two.packet_id))
    assert raw.expect(PUBREL).packet_id == two.packet_id
    raw.expect_silence()
    raw.send(ack_packet(PUBCOMP, two.packet_id))
    assert raw.expect(PUBLISH).payload == b"3"


def test_qos0_is_not_limited_by_the_inflight_window(start_broker, raw_client, paho_client):
    server = start_broker(broker={"max_inflight_messages": 1})
    raw = raw_client(server)
    raw.connect(unique_id())
    raw.subscribe(("w0/t", 0))
    pub = paho_client(server)
    for i in range(5):
        pub.publish("w0/t", str(i).encode(), qos=0)
    assert [raw.expect(PUBLISH).payload for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("version", VERSIONS)
def test_max_message_size_drops_oversized_publish(start_broker, paho_client, raw_client, version):
    server = start_broker(broker={"max_message_size": 1024})
    sub = paho_client(server, version)
    sub.subscribe("size/t", 1)
    big = raw_client(server, version)
    big.connect(unique_id(), version=version)
    # Refused: whether the broker acknowledges and drops it or closes the connection
    # (both are seen in the wild), the subscriber must not get it.
    big.send(publish_packet("size/t", b"x" * 2048, qos=1, packet_id=1, version=version))
    pub = paho_client(server, version)
    pub.publish("size/t", b"small", qos=1)
    assert sub.expect_message().payload == b"small"


def test_v5_puback_reports_no_matching_subscribers_or_success(broker, raw_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id())
    raw.send(publish_packet("nobody/listens", b"x", qos=1, packet_id=5, version=V5))
    ack = raw.expect(PUBACK)
    assert (ack.packet_id, ack.reason_code) in ((5, 0), (5, NO_MATCHING_SUBSCRIBERS))


def test_publish_between_versions(broker, paho_client):
    sub3 = paho_client(broker, V311)
    sub5 = paho_client(broker, V5)
    sub3.subscribe("mix/t", 2)
    sub5.subscribe("mix/t", 2)
    paho_client(broker, V5).publish("mix/t", b"from v5", qos=2)
    paho_client(broker, V311).publish("mix/t", b"from v3", qos=2)
    for sub in (sub3, sub5):
        assert [sub.expect_message().payload for _ in range(2)] == [b"from v5", b"from v3"]


def test_v5_no_local(broker, paho_client):
    from paho.mqtt.subscribeoptions import SubscribeOptions

    client = paho_client(broker, V5)
    client.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    client.subscribe("nl/sentinel", 1)
    client.publish("nl/t", b"own", qos=1)
    paho_client(broker, V5).publish("nl/sentinel", b"sentinel", qos=1)
    assert client.expect_message().payload == b"sentinel"
