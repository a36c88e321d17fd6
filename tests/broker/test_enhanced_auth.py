"""MQTT 5 enhanced authentication [4.12]: the AUTH exchange driven by on_auth_m5."""

from __future__ import annotations

import socket

import pytest

from broker.protocol import (
    Auth,
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Property,
    Publish,
    encode,
)
from hooks import Error, Ok

from .helpers import TIMEOUT, unique_id

METHOD = Property.AUTHENTICATION_METHOD
DATA = Property.AUTHENTICATION_DATA


class ChallengePlugin:
    """A two-step exchange: "hello" is answered with a challenge, "let me in" passes."""

    def on_auth_m5(self, ctx):
        data = ctx.properties.get(DATA)
        if data == b"hello":
            return Ok({"reason_code": 0x18, "properties": {DATA: b"challenge"}})
        if data == b"let me in":
            return Ok({"reason_code": 0, "properties": {DATA: b"welcome"}})
        return Error("bad_response", reason_code=0x8C)


class Peer:
    """A bare MQTT 5 socket: send packets, read the next one."""

    def __init__(self, server) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
        self.decoder = Decoder("client", 5)

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, 5))

    def receive(self):
        while (packet := self.decoder.next_packet()) is None:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.decoder.receive_data(data)
        return packet

    def connect(self, data: bytes, method: str = "challenge") -> None:
        props = {METHOD: method, DATA: data}
        self.send(Connect(unique_id("ea"), protocol_level=5, properties=props))


@pytest.fixture
def server(start_broker):
    return start_broker(
        plugins={
            "challenge": {
                "enabled": True,
                "module": "tests.broker.test_enhanced_auth:ChallengePlugin",
            }
        }
    )


def test_a_challenge_and_response_then_connack(server):
    peer = Peer(server)
    peer.connect(b"hello")
    assert peer.receive() == Auth(0x18, {METHOD: "challenge", DATA: b"challenge"})
    peer.send(Auth(0x18, {METHOD: "challenge", DATA: b"let me in"}))
    connack = peer.receive()
    assert type(connack) is ConnAck and connack.reason_code == 0
    assert (connack.properties[METHOD], connack.properties[DATA]) == ("challenge", b"welcome")


def test_a_wrong_response_is_refused_with_the_plugins_code(server):
    peer = Peer(server)
    peer.connect(b"hello")
    peer.receive()
    peer.send(Auth(0x18, {METHOD: "challenge", DATA: b"guess"}))
    assert peer.receive() == ConnAck(0x8C)
    assert peer.receive() is None  # and closed


def test_re_authentication(server):
    peer = Peer(server)
    peer.connect(b"let me in")
    assert peer.receive().reason_code == 0
    peer.send(Auth(0x19, {METHOD: "challenge", DATA: b"let me in"}))
    assert peer.receive() == Auth(0, {METHOD: "challenge", DATA: b"welcome"})
    peer.send(Auth(0x19, {METHOD: "challenge", DATA: b"wrong"}))
    assert peer.receive() == Disconnect(0x8C)


def test_other_packets_during_the_exchange_are_a_protocol_error(server):
    peer = Peer(server)
    peer.connect(b"hello")
    peer.receive()
    peer.send(Publish("too/early", b"x"))
    assert peer.receive() is None


def test_a_method_nobody_handles_gets_0x8c(broker):
    peer = Peer(broker)
    peer.connect(b"hello")
    assert peer.receive() == ConnAck(0x8C)


def test_auth_with_another_method_is_a_protocol_error(server):
    peer = Peer(server)
    peer.connect(b"let me in")
    peer.receive()
    peer.send(Auth(0x19, {METHOD: "other", DATA: b"let me in"}))
    assert peer.receive() == Disconnect(0x82)
