"""VerneMQ's limits: each has a default, a counter when it bites, and the right reason code."""

from __future__ import annotations

import time

import pytest

from hooks import Ok

from .helpers import (
    DISCONNECT,
    PUBACK,
    PUBLISH,
    PUBREC,
    V5,
    V311,
    VERSIONS,
    publish_packet,
    unique_id,
)

TOPIC_NAME_INVALID = 0x90
TOPIC_FILTER_INVALID = 0x8F
QUOTA_EXCEEDED = 0x97
RECEIVE_MAXIMUM_EXCEEDED = 0x93


def metrics(server) -> dict[str, int]:
    return server.call(server.broker.metrics.snapshot)


@pytest.mark.parametrize("version", VERSIONS)
def test_topic_max_depth(start_broker, raw_client, version):
    server = start_broker(broker={"topic_max_depth": 3})
    raw = raw_client(server, version)
    raw.connect(unique_id())
    refused = TOPIC_FILTER_INVALID if version == V5 else 0x80
    assert raw.subscribe(("a/b/c", 0), ("a/b/c/d", 0), ("a/+/#", 0)) == [0, refused, 0]
    raw.send(publish_packet("a/b/c/d", b"too deep", version=version))
    got = raw.expect_closed()
    if version == V5:
        assert [(p.type, p.reason_code) for p in got] == [(DISCONNECT, TOPIC_NAME_INVALID)]
    assert metrics(server)["topic_depth_exceeded"] == 2


def test_topic_max_depth_default_is_vernemqs_ten(broker, paho_client):
    client = paho_client(broker, V311)
    deep = "/".join("l" * 10)  # ten levels: allowed
    assert client.subscribe(deep, 0) == [0]
    assert client.subscribe(deep + "/x", 0) == [0x80]


@pytest.mark.parametrize("version", VERSIONS)
def test_max_subscriptions_per_client(start_broker, raw_client, version):
    server = start_broker(broker={"max_subscriptions_per_client": 2})
    raw = raw_client(server, version)
    raw.connect(unique_id())
    refused = QUOTA_EXCEEDED if version == V5 else 0x80
    assert raw.subscribe(("s/1", 1), ("s/2", 1), ("s/3", 1)) == [1, 1, refused]
    assert raw.subscribe(("s/1", 0)) == [0]  # replacing an existing one is not a new one
    assert metrics(server)["subscription_limit_exceeded"] == 1


def test_listener_max_connections(start_broker, raw_client, paho_client):
    server = start_broker(listeners=[{"address": "127.0.0.1:0", "max_connections": 2}])
    first = paho_client(server, V311)
    paho_client(server, V311)
    third = raw_client(server, V311)
    assert third.expect_closed() == []  # closed before it could even send CONNECT
    assert metrics(server)["listener_connections_refused"] == 1
    first.close()
    server.wait_for(lambda: server.broker.listener_connections[0] < 2)  # its socket is gone
    paho_client(server, V311)  # a slot is free again


def test_upgrade_outgoing_qos(start_broker, paho_client):
    server = start_broker(broker={"upgrade_outgoing_qos": True})
    sub = paho_client(server, V311)
    sub.subscribe("up/t", 2)
    pub = paho_client(server, V311)
    pub.publish("up/t", b"qos 0 in", qos=0)
    assert sub.expect_message().qos == 2


def test_max_message_rate_throttles_the_publisher(start_broker, raw_client):
    # VerneMQ's max_message_rate: past N PUBLISHes in a second the socket is not read
    # until the second is over, so 25 messages at 10/s take more than two windows.
    server = start_broker(broker={"max_message_rate": 10})
    raw = raw_client(server, V5)
    raw.connect(unique_id())
    started = time.monotonic()
    raw.send(
        b"".join(
            publish_packet("rate/t", b"x", qos=1, packet_id=i, version=V5) for i in range(1, 26)
        )
    )
    acks = [raw.expect(PUBACK).packet_id for _ in range(25)]
    assert acks == list(range(1, 26))  # nothing lost, nothing reordered
    assert time.monotonic() - started >= 2.0
    assert metrics(server)["client_publish_throttled"] >= 2


def test_retry_interval_resends_to_an_mqtt3_client_only(start_broker, raw_client, paho_client):
    # VerneMQ's retry_interval: an unacknowledged QoS 1 message is sent again with DUP to
    # a 3.1.1 client; never to an MQTT 5 client within a connection [MQTT-4.4.0-1].
    server = start_broker(broker={"retry_interval": 1})
    v3 = raw_client(server, V311)
    v3.connect(unique_id("r3"))
    v3.subscribe(("retry/t", 1))
    v5 = raw_client(server, V5)
    v5.connect(unique_id("r5"))
    v5.subscribe(("retry/t", 1))
    paho_client(server, V311).publish("retry/t", b"ack me", qos=1)
    first = v3.expect(PUBLISH)
    assert v5.expect(PUBLISH).dup is False
    again = v3.expect(PUBLISH, timeout=3.0)  # after one to two intervals
    assert (again.packet_id, again.dup, again.payload) == (first.packet_id, True, b"ack me")
    v5.expect_silence(0.5)
    assert metrics(server)["queue_message_retried"] >= 1


def test_retry_interval_register_modifier(start_broker, raw_client, paho_client):
    # A plugin may give one client its own retry_interval (seconds), as in VerneMQ.
    answer = {"result": "ok", "modifiers": {"retry_interval": 1}, "client_id": "fast-retry"}
    server = start_broker(
        broker={"retry_interval": 0, "allow_anonymous": False},
        plugins={
            "rec": {
                "enabled": True,
                "module": "tests.hooks.sample:Recorder",
                "hooks": ["auth_on_register"],
                "answers": {"auth_on_register": [answer, "ok"]},
            }
        },
    )
    fast, default = raw_client(server, V311), raw_client(server, V311)
    fast.connect("fast-retry")
    default.connect(unique_id())
    for client in (fast, default):
        client.subscribe(("retry/t", 1))
    paho_client(server, V311).publish("retry/t", b"ack me", qos=1)
    first = fast.expect(PUBLISH)
    default.expect(PUBLISH)
    again = fast.expect(PUBLISH, timeout=3.0)
    assert (again.packet_id, again.dup) == (first.packet_id, True)
    default.expect_silence(0.5)  # retry_interval 0: never resent within the connection


class InflightForOne:
    """Gives the user "narrow" an in-flight window of one message."""

    def auth_on_register(self, ctx):
        return Ok({"max_inflight_messages": 1} if ctx.username == "narrow" else {})


def test_register_modifiers_apply_to_their_connection_only(start_broker, raw_client, paho_client):
    # A persistent session resumed by a CONNECT the plugin gives no modifier starts again
    # from the configured settings.
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"p": {"enabled": True, "module": "tests.broker.test_limits:InflightForOne"}},
    )
    client_id = unique_id("window")
    publisher = paho_client(server, V311, username="any")
    first = raw_client(server, V311)
    first.connect(client_id, clean=False, username="narrow")
    first.subscribe(("window/t", 1))
    for payload in (b"a", b"b"):
        publisher.publish("window/t", payload, 1)
    assert first.expect(PUBLISH).payload == b"a"
    first.expect_silence()  # a window of one: "b" waits for the PUBACK
    first.close()
    again = raw_client(server, V311)
    again.connect(client_id, clean=False)
    assert [again.expect(PUBLISH).payload for _ in range(2)] == [b"a", b"b"]  # window 20


def test_a_closing_connection_still_reads_what_the_client_sends(start_broker, raw_client):
    # The broker closes a connection (here: more QoS 2 PUBLISHes than its Receive Maximum)
    # while the client is still sending. It stops writing after its DISCONNECT but keeps
    # reading and discarding for a moment, so the client's sends do not fail with a broken
    # pipe or a reset before it has read why [Paho's test_flow_control2].
    server = start_broker(broker={"receive_max_broker": 2})
    raw = raw_client(server, V5)
    raw.connect(unique_id("rmax"))
    raw.send(
        b"".join(publish_packet("rmax/t", b"q2", qos=2, packet_id=i, version=V5) for i in (1, 2, 3))
    )
    assert [raw.read_packet().type for _ in range(2)] == [PUBREC, PUBREC]
    disconnect = raw.read_packet()
    assert (disconnect.type, disconnect.reason_code) == (DISCONNECT, RECEIVE_MAXIMUM_EXCEEDED)
    raw.send(publish_packet("rmax/t", b"x" * 1000, version=V5) * 1000)  # 1 MB, unanswered
    assert raw.expect_closed() == []  # then a clean end of stream
