"""PROXY protocol v1 / v2 on a listener: headers written by the tests (with the
proxy-protocol library's packer for v2) before real MQTT, the address they name reaching
the hooks (the event relay's on_register), and bad or missing headers closing only their
connection."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl

import msgpack
import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st
from proxyprotocol.result import ProxyResultIPv4, ProxyResultIPv6, ProxyResultLocal
from proxyprotocol.v2 import ProxyProtocolV2
from websockets.sync.client import connect as ws_connect

from broker.proxy_protocol import BadHeader, header_length
from event_relay.schema import decode_event
from tests.broker.helpers import CONNACK, TIMEOUT, RawClient, connect_packet

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


# ----------------------------------------------------------- with TLS and WebSockets


@pytest.fixture
def pki(tmp_path):
    """A CA, the server's certificate for 127.0.0.1, a client certificate; as files."""
    ca = trustme.CA()
    files = {"cafile": tmp_path / "ca.pem", "certfile": tmp_path / "s.crt"}
    files |= {"keyfile": tmp_path / "s.key"}
    ca.cert_pem.write_to_path(str(files["cafile"]))
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(files["certfile"]))
    server.private_key_pem.write_to_path(str(files["keyfile"]))
    return ca, {key: str(path) for key, path in files.items()}


def proxied_over(start_broker, kind: str, tls: dict):
    listener = {"type": kind, "address": "127.0.0.1:0", "proxy_protocol": True, **tls}
    return start_broker(
        listeners=[listener], event_relay={"enabled": True, "address": "127.0.0.1:0"}
    )


def tls_after_header(port: int, header: bytes, context: ssl.SSLContext) -> bytes:
    """The header and the ClientHello in one write (as a load balancer may send them),
    the rest of the handshake, then CONNECT: the CONNACK's bytes."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        sock.sendall(header + outgoing.read())
        while True:
            incoming.write(sock.recv(65536))
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
        sock.sendall(outgoing.read())
        tls.write(connect_packet("behind-tls"))
        sock.sendall(outgoing.read())
        answer = b""
        while len(answer) < 4:
            chunk = sock.recv(65536)
            assert chunk, "closed before the CONNACK"
            incoming.write(chunk)
            with contextlib.suppress(ssl.SSLWantReadError):
                answer += tls.read(65536)
        return answer


def test_the_header_comes_before_tls_with_a_client_certificate(start_broker, pki):
    ca, files = pki
    server = proxied_over(start_broker, "ssl", {**files, "require_certificate": True})
    context = ssl.create_default_context(cafile=files["cafile"])
    ca.issue_cert("device-9").configure_cert(context)
    assert tls_after_header(server.port, V1, context) == b"\x20\x02\x00\x00"
    assert registered_peers(server) == [("203.0.113.7", 51234)]
    # Without a certificate the handshake fails: no MQTT at all.
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        tls_after_header(server.port, V1, ssl.create_default_context(cafile=files["cafile"]))


@pytest.mark.parametrize("kind", ["ws", "wss"])
def test_the_header_comes_before_the_websocket_upgrade(start_broker, pki, kind):
    _, files = pki
    server = proxied_over(start_broker, kind, files if kind == "wss" else {})
    sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    sock.sendall(V2_IPV4)
    scheme = "wss" if kind == "wss" else "ws"
    context = ssl.create_default_context(cafile=files["cafile"]) if kind == "wss" else None
    with ws_connect(
        f"{scheme}://127.0.0.1:{server.port}/mqtt", sock=sock, ssl=context, subprotocols=["mqtt"]
    ) as client:
        client.send(connect_packet("behind-ws"))
        assert client.recv(timeout=TIMEOUT) == b"\x20\x02\x00\x00"
    assert registered_peers(server) == [("198.51.100.9", 4000)]
