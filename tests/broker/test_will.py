"""Last Will and Testament: when it is published, when not, and the MQTT 5 will delay."""

from __future__ import annotations

import time

import pytest

from .helpers import (
    DISCONNECT,
    SESSION_EXPIRY_INTERVAL,
    V5,
    VERSIONS,
    WILL_DELAY_INTERVAL,
    WillSpec,
    unique_id,
)

DISCONNECT_WITH_WILL_MESSAGE = 0x04


def watcher(paho_client, server, topic="will/#"):
    sub = paho_client(server, V5)
    sub.subscribe(topic, 2)
    return sub


@pytest.mark.parametrize("version", VERSIONS)
def test_will_published_on_network_loss(broker, raw_client, paho_client, version):
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, version)
    raw.connect(unique_id(), will=WillSpec("will/lost", b"gone", qos=1))
    raw.close()  # no DISCONNECT
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("will/lost", b"gone", 1, False)


@pytest.mark.parametrize("version", VERSIONS)
def test_will_published_on_keepalive_timeout(broker, raw_client, paho_client, version):
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, version)
    raw.connect(unique_id(), keepalive=1, will=WillSpec("will/silent", b"timeout"))
    start = time.monotonic()
    msg = sub.expect_message(timeout=4)
    assert (msg.topic, msg.payload) == ("will/silent", b"timeout")
    assert 1.25 <= time.monotonic() - start <= 3.0


@pytest.mark.parametrize("version", VERSIONS)
def test_will_not_published_on_normal_disconnect(broker, raw_client, paho_client, version):
    # [MQTT-3.14.4-3]: DISCONNECT (reason 0 in 5.0) discards the will.
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, version)
    raw.connect(unique_id(), will=WillSpec("will/t", b"should not appear"))
    raw.disconnect()
    paho_client(broker, V5).publish("will/t", b"sentinel", qos=1)
    assert sub.expect_message().payload == b"sentinel"


def test_will_not_published_on_paho_disconnect(broker, paho_client):
    sub = watcher(paho_client, broker)
    client = paho_client(broker, will=WillSpec("will/paho", b"nope"))
    client.disconnect()
    paho_client(broker).publish("will/paho", b"sentinel", qos=1)
    assert sub.expect_message().payload == b"sentinel"


def test_v5_disconnect_with_will_message_publishes_it(broker, raw_client, paho_client):
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, V5)
    raw.connect(unique_id(), will=WillSpec("will/asked", b"as requested"))
    raw.disconnect(reason=DISCONNECT_WITH_WILL_MESSAGE)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload) == ("will/asked", b"as requested")


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_will(broker, raw_client, paho_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), will=WillSpec("will/ret", b"last words", qos=1, retain=True))
    live = watcher(paho_client, broker, "will/ret")
    raw.close()
    assert live.expect_message().payload == b"last words"
    later = paho_client(broker, version)
    later.subscribe("will/ret", 1)
    msg = later.expect_message()
    assert (msg.payload, msg.retain) == (b"last words", True)


def test_v5_will_delay_interval(broker, raw_client, paho_client):
    # [MQTT-3.1.3-9]: the will waits for the Will Delay Interval (the session must outlive
    # it: the will goes out when the delay passes or the session ends, whichever is first).
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, V5)
    will = WillSpec("will/delayed", b"late", properties={WILL_DELAY_INTERVAL: 1})
    raw.connect(unique_id(), clean=False, will=will, properties={SESSION_EXPIRY_INTERVAL: 60})
    raw.close()
    start = time.monotonic()
    msg = sub.expect_message(timeout=4)
    elapsed = time.monotonic() - start
    assert msg.payload == b"late"
    assert 0.8 <= elapsed <= 3.0, elapsed


def test_v5_will_delay_cancelled_by_reconnect(broker, raw_client, paho_client):
    sub = watcher(paho_client, broker)
    client_id = unique_id("wd")
    will = WillSpec("will/cancelled", b"must not appear", properties={WILL_DELAY_INTERVAL: 1})
    props = {SESSION_EXPIRY_INTERVAL: 60}
    raw = raw_client(broker, V5)
    raw.connect(client_id, clean=False, will=will, properties=props)
    raw.close()
    again = raw_client(broker, V5)
    assert again.connect(client_id, clean=False, properties=props).session_present is True
    sub.expect_no_message(timeout=2.0)  # past the 1 s delay
    assert again.is_open()


def test_v5_will_sent_when_session_ends_before_delay(broker, raw_client, paho_client):
    # Session Expiry 0: the session ends at the disconnect, so the will goes out at once
    # even with a long Will Delay Interval.
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, V5)
    will = WillSpec("will/ended", b"now", properties={WILL_DELAY_INTERVAL: 60})
    raw.connect(unique_id(), will=will)
    raw.close()
    assert sub.expect_message(timeout=2.0).payload == b"now"


def test_v5_will_sent_when_session_expires_before_delay(broker, raw_client, paho_client):
    # 5.0 section 3.1.3.2.2: the will waits until the delay passes or the session ends,
    # whichever is first: here the 1 s session expiry.
    sub = watcher(paho_client, broker)
    raw = raw_client(broker, V5)
    will = WillSpec("will/expired", b"session over", properties={WILL_DELAY_INTERVAL: 60})
    raw.connect(unique_id(), clean=False, will=will, properties={SESSION_EXPIRY_INTERVAL: 1})
    raw.close()
    start = time.monotonic()
    assert sub.expect_message(timeout=4).payload == b"session over"
    assert 0.8 <= time.monotonic() - start <= 3.0


def test_v5_takeover_publishes_the_will_of_the_old_connection(broker, raw_client, paho_client):
    # MQTT 5 section 3.1.4: on takeover "If the existing Client has a Will Message, that
    # Will Message is published" (no will delay here).
    sub = watcher(paho_client, broker)
    client_id = unique_id("tw")
    first = raw_client(broker, V5)
    first.connect(client_id, will=WillSpec("will/takeover", b"taken"))
    second = raw_client(broker, V5)
    second.connect(client_id)
    got = first.expect_closed()
    assert [p.type for p in got] == [DISCONNECT]
    assert sub.expect_message().payload == b"taken"


def test_will_qos2_delivery(broker, raw_client, paho_client):
    sub = watcher(paho_client, broker)
    raw = raw_client(broker)
    raw.connect(unique_id(), will=WillSpec("will/q2", b"q2", qos=2))
    raw.close()
    msg = sub.expect_message()
    assert (msg.payload, msg.qos) == (b"q2", 2)
