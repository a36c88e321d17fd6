"""Persistent sessions: clean session / clean start, offline queues, expiry, redelivery.

A subscriber that goes offline does so with DISCONNECT followed by waiting for the broker
to close the socket (`RawClient.disconnect`), so the test knows the broker has processed
it before anything is published. Absence of a message is checked with a sentinel: a later
message on the same topic that must arrive first if the unwanted one is not there.
"""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .helpers import (
    CONNACK,
    MESSAGE_EXPIRY_INTERVAL,
    PUBLISH,
    PUBREL,
    SESSION_EXPIRY_INTERVAL,
    V5,
    V311,
    VERSIONS,
    ack_packet,
    connect_packet,
    unique_id,
)

PUBREC = 5


def persistent(version: int, expiry: int = 60) -> dict:
    """CONNECT keyword arguments for a session that outlives the connection."""
    props = {SESSION_EXPIRY_INTERVAL: expiry} if version == V5 else {}
    return {"clean": False, "properties": props}


def go_offline(raw_client, server, version, client_id, *filters):
    """Create a persistent session subscribed to `filters`, then disconnect it."""
    raw = raw_client(server, version)
    connack = raw.connect(client_id, **persistent(version))
    if filters:
        raw.subscribe(*filters)
    raw.disconnect()
    return connack


def drain_publishes(raw, sentinel: bytes) -> list:
    """Read and acknowledge PUBLISH packets up to and including the sentinel payload."""
    got = []
    while True:
        pkt = raw.expect(PUBLISH)
        raw.ack(pkt)
        got.append(pkt)
        if pkt.payload == sentinel:
            return got


@pytest.mark.parametrize("version", VERSIONS)
def test_offline_qos1_qos2_are_queued_and_qos0_is_not(broker, raw_client, paho_client, version):
    client_id = unique_id("offline")
    first = go_offline(raw_client, broker, version, client_id, ("off/t", 2))
    assert first.session_present is False

    pub = paho_client(broker, version)
    pub.publish("off/t", b"qos0", qos=0)
    pub.publish("off/t", b"qos1", qos=1)
    pub.publish("off/t", b"qos2", qos=2)

    sub = raw_client(broker, version)
    connack = sub.connect(client_id, **persistent(version))
    assert connack.session_present is True
    pub.publish("off/t", b"live", qos=1)  # the subscription survived: no re-subscribe
    got = drain_publishes(sub, b"live")
    assert [(p.payload, p.qos) for p in got] == [(b"qos1", 1), (b"qos2", 2), (b"live", 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_persistent_session_receives_offline_messages(broker, paho_client, version):
    client_id = unique_id("paho-off")
    kwargs = {"clean": False, "session_expiry": 60 if version == V5 else None}
    sub = paho_client(broker, version, client_id, **kwargs)
    sub.subscribe("paho/off", 1)
    sub.disconnect()

    pub = paho_client(broker, version)
    for i in range(3):
        pub.publish("paho/off", f"m{i}".encode(), qos=1)

    again = paho_client(broker, version, client_id, connect=False)
    assert again.connect(**kwargs).session_present is True
    got = [again.expect_message().payload for _ in range(3)]
    # Delivered in order, possibly as redeliveries if the broker raced the DISCONNECT.
    assert got == [b"m0", b"m1", b"m2"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("queue_type", "kept"), [(None, [b"1", b"2"]), ("fifo", [b"1", b"2"]), ("lifo", [b"4", b"5"])]
)
def test_max_offline_messages_and_queue_type(
    start_broker, raw_client, paho_client, version, queue_type, kept
):
    # VerneMQ semantics: a full fifo queue drops the new message (keeps the oldest),
    # a full lifo queue drops the oldest (keeps the newest). fifo is the default.
    section = {"max_offline_messages": 2}
    if queue_type:
        section["queue_type"] = queue_type
    server = start_broker(broker=section)
    client_id = unique_id("limit")
    go_offline(raw_client, server, version, client_id, ("lim/t", 1))

    pub = paho_client(server, version)
    for i in range(1, 6):
        pub.publish("lim/t", str(i).encode(), qos=1)

    sub = raw_client(server, version)
    assert sub.connect(client_id, **persistent(version)).session_present is True
    pub.publish("lim/t", b"live", qos=1)
    got = drain_publishes(sub, b"live")
    assert sorted(p.payload for p in got[:-1]) == kept
    assert len(got) == 3


@pytest.mark.parametrize("version", VERSIONS)
def test_clean_reconnect_discards_the_old_session(broker, raw_client, paho_client, version):
    client_id = unique_id("clean")
    go_offline(raw_client, broker, version, client_id, ("clean/t", 1))
    pub = paho_client(broker, version)
    pub.publish("clean/t", b"lost", qos=1)

    sub = raw_client(broker, version)
    connack = sub.connect(client_id, clean=True)
    assert connack.session_present is False
    # Neither the queued message nor the subscription survived.
    sub.subscribe(("clean/other", 1))
    pub.publish("clean/t", b"after", qos=1)
    pub.publish("clean/other", b"sentinel", qos=1)
    got = sub.expect(PUBLISH)
    assert got.payload == b"sentinel"
    sub.disconnect()

    # ...and a clean session leaves nothing behind after it ends either.
    again = raw_client(broker, version)
    assert again.connect(client_id, **persistent(version)).session_present is False


def test_v5_session_expiry_zero_ends_the_session_at_disconnect(broker, raw_client):
    client_id = unique_id("exp0")
    raw = raw_client(broker, V5)
    raw.connect(client_id, clean=False)  # no Session Expiry Interval property: 0
    raw.subscribe(("exp0/t", 1))
    raw.disconnect()
    again = raw_client(broker, V5)
    assert again.connect(client_id, clean=False).session_present is False


def test_v5_session_expiry_interval(broker, raw_client, paho_client):
    client_id = unique_id("exp1")
    go_offline_v5 = {"clean": False, "properties": {SESSION_EXPIRY_INTERVAL: 1}}
    raw = raw_client(broker, V5)
    raw.connect(client_id, **go_offline_v5)
    raw.subscribe(("exp1/t", 1))
    raw.disconnect()

    # Within the interval the session is still there...
    broker.advance(0.5)
    again = raw_client(broker, V5)
    assert again.connect(client_id, **go_offline_v5).session_present is True
    again.disconnect()
    # ...after it, it is gone with its subscription (the reconnect started a new interval).
    broker.advance(1.5)
    pub = paho_client(broker, V5)
    pub.publish("exp1/t", b"nobody", qos=1)
    last = raw_client(broker, V5)
    assert last.connect(client_id, **go_offline_v5).session_present is False
    last.expect_silence()


def test_v5_session_expiry_can_be_changed_on_disconnect(broker, raw_client):
    # [MQTT-3.14.2.2.2]: DISCONNECT may set a new expiry if CONNECT's was non-zero.
    client_id = unique_id("exp-dis")
    raw = raw_client(broker, V5)
    raw.connect(client_id, clean=False, properties={SESSION_EXPIRY_INTERVAL: 60})
    raw.send(b"\xe0\x07\x00\x05" + bytes([SESSION_EXPIRY_INTERVAL]) + b"\x00\x00\x00\x00")
    raw.expect_closed()
    again = raw_client(broker, V5)
    assert again.connect(client_id, clean=False).session_present is False


def test_persistent_client_expiration_expires_v311_sessions(start_broker, raw_client):
    server = start_broker(broker={"persistent_client_expiration": 1})
    client_id = unique_id("pce")
    go_offline(raw_client, server, V311, client_id, ("pce/t", 1))
    server.advance(0.5)
    again = raw_client(server)
    assert again.connect(client_id, clean=False).session_present is True
    again.disconnect()
    server.advance(1.5)
    last = raw_client(server)
    assert last.connect(client_id, clean=False).session_present is False


def test_persistent_sessions_do_not_expire_by_default(broker, raw_client):
    client_id = unique_id("keep")
    go_offline(raw_client, broker, V311, client_id, ("keep/t", 1))
    broker.advance(24 * 3600)
    again = raw_client(broker)
    assert again.connect(client_id, clean=False).session_present is True


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("graceful", [True, False], ids=["disconnect", "drop"])
def test_unacked_qos1_is_redelivered_with_dup(broker, raw_client, paho_client, version, graceful):
    # [MQTT-4.4.0-1]: on reconnect with a persistent session, unacknowledged PUBLISH
    # packets are re-sent with their original packet identifiers, DUP set [MQTT-3.3.1-1].
    client_id = unique_id("redeliver")
    sub = raw_client(broker, version)
    sub.connect(client_id, **persistent(version))
    sub.subscribe(("redo/t", 1))
    pub = paho_client(broker, version)
    pub.publish("redo/t", b"once", qos=1)
    first = sub.expect(PUBLISH)
    assert (first.payload, first.qos, first.dup) == (b"once", 1, False)
    if graceful:
        sub.disconnect()
    else:
        sub.close()

    again = raw_client(broker, version)
    connack = again.connect(client_id, **persistent(version))
    assert connack.session_present is True
    redo = again.expect(PUBLISH)
    assert (redo.payload, redo.qos, redo.packet_id, redo.dup) == (
        b"once",
        1,
        first.packet_id,
        True,
    )
    again.ack(redo)
    pub.publish("redo/t", b"next", qos=1)
    nxt = again.expect(PUBLISH)
    assert (nxt.payload, nxt.dup) == (b"next", False)


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_pubrel_is_resent_after_reconnect(broker, raw_client, paho_client, version):
    # [MQTT-4.4.0-1]: unacknowledged PUBREL packets are re-sent too.
    client_id = unique_id("pubrel")
    sub = raw_client(broker, version)
    sub.connect(client_id, **persistent(version))
    sub.subscribe(("rel/t", 2))
    pub = paho_client(broker, version)
    pub.publish("rel/t", b"exactly once", qos=2)
    msg = sub.expect(PUBLISH)
    sub.send(ack_packet(PUBREC, msg.packet_id))
    assert sub.expect(PUBREL).packet_id == msg.packet_id
    sub.close()  # PUBREL never completed

    again = raw_client(broker, version)
    assert again.connect(client_id, **persistent(version)).session_present is True
    rel = again.expect(PUBREL)
    assert rel.packet_id == msg.packet_id
    assert rel.flags == 0x02
    again.send(ack_packet(7, rel.packet_id))  # PUBCOMP
    pub.publish("rel/t", b"sentinel", qos=2)
    nxt = again.expect(PUBLISH)
    assert nxt.payload == b"sentinel"  # the first message is not delivered a second time


def test_takeover_with_persistent_session_keeps_subscriptions(broker, raw_client, paho_client):
    client_id = unique_id("take")
    first = raw_client(broker)
    first.connect(client_id, clean=False)
    first.subscribe(("take/t", 1))
    second = raw_client(broker)
    assert second.connect(client_id, clean=False).session_present is True
    assert first.expect_closed() == []
    pub = paho_client(broker)
    pub.publish("take/t", b"to the new connection", qos=1)
    assert second.expect(PUBLISH).payload == b"to the new connection"


def test_connack_session_present_is_zero_for_a_new_persistent_session(broker, raw_client):
    raw = raw_client(broker)
    raw.send(connect_packet(unique_id("new"), clean=False))
    connack = raw.expect(CONNACK)
    assert connack.body == b"\x00\x00"


def test_v5_message_expiry_interval(broker, raw_client, paho_client):
    # [MQTT-3.3.2-5]: an expired message is not delivered; [MQTT-3.3.2-6]: the forwarded
    # Message Expiry Interval is the received value minus the time spent waiting.
    client_id = unique_id("mexp")
    go_offline(raw_client, broker, V5, client_id, ("mexp/t", 1))
    pub = paho_client(broker, V5)
    short, long_ = Properties(PacketTypes.PUBLISH), Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval, long_.MessageExpiryInterval = 1, 60
    pub.publish("mexp/t", b"short", qos=1, properties=short)
    pub.publish("mexp/t", b"long", qos=1, properties=long_)
    broker.advance(1.5)  # the first one expires in the offline queue
    sub = raw_client(broker, V5)
    assert sub.connect(client_id, **persistent(V5)).session_present is True
    got = sub.expect(PUBLISH)
    assert got.payload == b"long"
    assert got.properties[MESSAGE_EXPIRY_INTERVAL] <= 59


@pytest.mark.parametrize("restart", [False, True], ids=["memory", "leveldb-restart"])
def test_v5_expired_messages_make_room_in_a_full_queue(
    start_broker, raw_client, paho_client, tmp_path, restart
):
    # Expired messages are dropped from every queue: a full offline queue lets go of them
    # before it would drop a live message (fifo drops the newest); the store forgets them.
    sections: dict = {"broker": {"max_offline_messages": 2}}
    if restart:
        sections["store"] = {"backend": "leveldb", "path": str(tmp_path / "db")}
    server = start_broker(**sections)
    client_id = unique_id("room")
    go_offline(raw_client, server, V5, client_id, ("room/t", 1))
    pub = paho_client(server, V5)
    short = Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    for payload in (b"old-1", b"old-2"):
        pub.publish("room/t", payload, qos=1, properties=short)
    server.advance(1.5)  # both expire
    for payload in (b"live-1", b"live-2"):
        pub.publish("room/t", payload, qos=1)
    counters = server.call(server.broker.metrics.snapshot)
    assert (counters["queue_message_expired"], counters["queue_message_drop"]) == (2, 0)
    if restart:
        server.stop()
        server = start_broker(**sections)
    sub = raw_client(server, V5)
    sub.connect(client_id, **persistent(V5))
    assert [sub.expect(PUBLISH).payload for _ in range(2)] == [b"live-1", b"live-2"]
    sub.expect_silence()
