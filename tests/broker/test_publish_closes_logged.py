"""A PUBLISH that closes its connection logs the one INFO line docs/operations.md
promises for a protocol error and the connection it closes (Logs): a topic deeper than
`topic_max_depth` first (a hostile probe found that close silent), then an invalid topic
name, a topic alias above the maximum or never set, and too many unreleased QoS 2
messages. Real clients: raw sockets for 3.1.1 and 5, paho-mqtt 5."""

from __future__ import annotations

import logging

import pytest

from .helpers import DISCONNECT, V5, V311, VERSIONS, PahoClient, publish_packet, unique_id

TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94
PROTOCOL_ERROR = 0x82
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS = 0x23  # the property's id


def protocol_errors(caplog: pytest.LogCaptureFixture, client_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "nautilus.connection"
        and r.levelno == logging.INFO
        and client_id in r.getMessage()
        and "protocol error" in r.getMessage()
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_publish_deeper_than_topic_max_depth_is_logged(
    start_broker, raw_client, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    caplog.set_level(logging.INFO)
    server = start_broker(broker={"topic_max_depth": 3})
    raw = raw_client(server, version)
    client_id = unique_id()
    raw.connect(client_id)
    raw.send(publish_packet("a/b/c", b"deep enough", version=version))
    raw.send(publish_packet("a/b/c/d", b"too deep", version=version))
    got = raw.expect_closed()
    if version == V5:
        assert [(p.type, p.reason_code) for p in got] == [(DISCONNECT, TOPIC_NAME_INVALID)]
    assert protocol_errors(caplog, client_id) == [
        f"127.0.0.1:{raw.sock.getsockname()[1]} ({client_id}): protocol error: PUBLISH: "
        "topic of 4 levels, deeper than topic_max_depth (3) ('a/b/c/d')"
    ]


def test_a_deep_topic_from_paho_is_logged_once_with_the_topic_cut(
    start_broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = start_broker(broker={"topic_max_depth": 10})
    client = PahoClient(server.host, server.port, V5)
    client.connect()
    try:
        deep = "/".join(f"level-{i:03d}" for i in range(40))
        assert client.client is not None
        client.client.publish(deep, b"x")
        assert client.expect_disconnected() == TOPIC_NAME_INVALID
    finally:
        client.close()
    (line,) = protocol_errors(caplog, client.client_id)
    assert "topic of 40 levels, deeper than topic_max_depth (10)" in line
    assert line.endswith("...')")  # the topic is cut at 100 characters
    assert "level-039" not in line


@pytest.mark.parametrize(
    ("packet", "code", "why"),
    [
        (publish_packet("a/+/c", b"", version=V5), TOPIC_NAME_INVALID, "invalid topic name"),
        (
            publish_packet("t", b"", version=V5, properties={TOPIC_ALIAS: 60000}),
            TOPIC_ALIAS_INVALID,
            "topic alias 60000 above topic_alias_max_broker",
        ),
        (
            publish_packet("", b"", version=V5, properties={TOPIC_ALIAS: 1}),
            PROTOCOL_ERROR,
            "topic alias 1 never set",
        ),
    ],
    ids=["wildcard", "alias too big", "alias unset"],
)
def test_other_publishes_that_close_are_logged(
    start_broker, raw_client, caplog: pytest.LogCaptureFixture, packet: bytes, code: int, why: str
) -> None:
    caplog.set_level(logging.INFO)
    server = start_broker(broker={"topic_alias_max_broker": 10})
    raw = raw_client(server, V5)
    client_id = unique_id()
    raw.connect(client_id)
    raw.send(packet)
    assert [(p.type, p.reason_code) for p in raw.expect_closed()] == [(DISCONNECT, code)]
    (line,) = protocol_errors(caplog, client_id)
    assert f"protocol error: PUBLISH: {why}" in line


def test_too_many_unreleased_qos2_is_logged(
    start_broker, raw_client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = start_broker(broker={"receive_max_broker": 2})
    raw = raw_client(server, V311)
    client_id = unique_id()
    raw.connect(client_id)
    for packet_id in (1, 2, 3):  # never released (no PUBREL)
        raw.send(publish_packet("q", b"", qos=2, packet_id=packet_id, version=V311))
    raw.expect_closed()
    (line,) = protocol_errors(caplog, client_id)
    assert "more QoS 2 messages unreleased than receive_max_broker" in line
