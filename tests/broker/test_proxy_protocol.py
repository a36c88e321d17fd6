"""PROXY protocol v1 / v2 on a listener: headers written by the tests (with the
proxy-protocol library's packer for v2) before real MQTT, the address they name reaching
the hooks (the event relay's on_register), and bad or missing headers closing only their
connection."""

from __future__ import annotations

import ipaddress

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxyprotocol.result import ProxyResultIPv4, ProxyResultIPv6, ProxyResultLocal
from proxyprotocol.v2 import ProxyProtocolV2

from broker.config import ConfigError, config_from_dict
from broker.proxy_protocol import BadHeader, header_length
from event_relay.schema import decode_event
from tests.broker.helpers import CONNACK, RawClient, connect_packet

V1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 1883\r\n"
V1_IPV6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 1883\r\n"
V2_IPV4 = ProxyProtocolV2().pack(
    ProxyResultIPv4(
        (ipaddress.IPv4Address("198.51.100.9"), 4000), (ipaddress.IPv4Address("10.0.0.1"), 1883)
    )
)
V2_IPV6 = ProxyProtocolV2().pack(
    ProxyResultIPv6(
        (ipaddress.IPv6Address("2001:db8::9"), 4001), (ipaddress.IPv6Address("2001:db8::1"), 1883)
    )
)
V2_LOCAL = ProxyProtocolV2().pack(ProxyResultLocal())  # a load balancer's health check


@pytest.fixture
def proxied(start_broker):
    """A broker whose listener expects PROXY headers, with the relay recording events."""
    return start_broker(
        listeners=[{"type": "tcp", "address": "127.0.0.1:0", "proxy_protocol": True}],
        event_relay={"enabled": True, "address": "127.0.0.1:0"},
    )


def registered_peers(server) -> list[tuple[str, int]]:
    """(peer_addr, peer_port) of every on_register event the relay holds."""
    relay = dict(server.broker.plugins)["event_relay"]

    def read() -> list[tuple[str, int]]:
        data, _ = relay.log.read(relay.log.first_seq, 1000)
        events = [decode_event(msgpack.unpackb(item)) for item in data]
        return [(e["peer_addr"], e["peer_port"]) for e in events if e["type"] == "on_register"]

    return server.call(read)


@pytest.mark.parametrize(
    ("header", "peer"),
    [
        (V1, ("203.0.113.7", 51234)),
        (V1_IPV6, ("2001:db8::7", 40000)),
        (V2_IPV4, ("198.51.100.9", 4000)),
        (V2_IPV6, ("2001:db8::9", 4001)),
    ],
    ids=["v1-tcp4", "v1-tcp6", "v2-ipv4", "v2-ipv6"],
)
def test_the_header_names_the_client_for_the_hooks(proxied, header, peer):
    client = RawClient(proxied.host, proxied.port)
    try:
        client.send(header + connect_packet("behind-lb"))  # one segment: header and CONNECT
        assert client.expect(CONNACK).reason_code == 0
        assert client.is_open()
    finally:
        client.close()
    assert registered_peers(proxied) == [peer]


def test_a_header_in_pieces_and_a_local_header(proxied):
    """Byte by byte (each its own send), then LOCAL: the socket's own address stays."""
    pieced = RawClient(proxied.host, proxied.port)
    local = RawClient(proxied.host, proxied.port)
    try:
        for i in range(len(V2_IPV4)):
            pieced.send(V2_IPV4[i : i + 1])
        pieced.connect("pieced")
        local.send(V2_LOCAL)
        local.connect("local")
        own = local.sock.getsockname()[:2]
    finally:
        pieced.close()
        local.close()
    assert registered_peers(proxied) == [("198.51.100.9", 4000), own]


@pytest.mark.parametrize(
    "opening",
    [
        connect_packet("no-header"),  # a client that skipped the load balancer
        b"PROXY TCP4 999.0.0.1 10.0.0.1 1 1883\r\n" + connect_packet("bad-address"),
        b"PROXY " + b"x" * 120,  # no end of line where there must be one
    ],
    ids=["no-header", "bad-address", "too-long"],
)
def test_a_bad_or_missing_header_closes_only_that_connection(proxied, opening):
    good = RawClient(proxied.host, proxied.port)
    bad = RawClient(proxied.host, proxied.port)
    try:
        good.send(V1)
        good.connect("good")
        bad.send(opening)
        assert bad.expect_closed() == []  # nothing, not even a CONNACK
        assert good.is_open()
    finally:
        good.close()
        bad.close()
    assert registered_peers(proxied) == [("203.0.113.7", 51234)]


def test_no_header_in_time_closes_the_connection(proxied):
    silent = RawClient(proxied.host, proxied.port)
    try:
        silent.send(V1[:10])
        proxied.wait_for(lambda: len(proxied.broker.awaiting_header) == 1)
        proxied.advance(proxied.config.broker.connect_timeout + 1)
        assert silent.expect_closed() == []
    finally:
        silent.close()


def test_a_plain_listener_takes_no_header(start_broker):
    """Without proxy_protocol a header is just bytes that are not MQTT."""
    server = start_broker()
    client = RawClient(server.host, server.port)
    try:
        client.send(V1 + connect_packet("plain"))
        assert client.expect_closed() == []
    finally:
        client.close()


@given(header=st.sampled_from([V1, V1_IPV6, V2_IPV4, V2_IPV6, V2_LOCAL]), rest=st.binary())
def test_header_length_frames_exactly_the_header(header, rest):
    for cut in range(len(header)):
        assert header_length(header[:cut]) is None
    assert header_length(header + rest) == len(header)


@pytest.mark.parametrize("data", [b"\x10", b"GET / HTTP/1.1\r\n", b"\r\n\r\nX", b"PROXX"])
def test_header_length_refuses_what_is_no_header(data):
    with pytest.raises(BadHeader):
        header_length(data)


def test_proxy_protocol_on_an_ssl_listener_is_a_config_error(tmp_path):
    listener = {"type": "ssl", "address": "127.0.0.1:0", "proxy_protocol": True}
    listener |= {"certfile": "server.crt", "keyfile": "server.key"}
    with pytest.raises(
        ConfigError, match=r"^listeners\[0\]\.proxy_protocol: only on tcp listeners"
    ):
        config_from_dict({"listeners": [listener]})
