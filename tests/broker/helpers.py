"""Clients for the broker behaviour tests: a blocking paho-mqtt wrapper and a raw socket.

`PahoClient` wraps paho-mqtt (MQTT 3.1, 3.1.1, 5.0) so that a test can write
`sub.subscribe("a/#", 1)` and `sub.expect_message()` and every step waits on the event it
needs (CONNACK, SUBACK, PUBACK/PUBCOMP, a message) with a timeout, never on a sleep.

`RawClient` speaks MQTT over a plain socket with its own small encoder and decoder, kept
independent of `broker.protocol` on purpose: the tests must not share a bug with the code
they test, and they must be able to send bytes no well-behaved codec would produce.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

TIMEOUT = 5.0  # the longest any single expected event may take
QUIET = 0.5  # how long "nothing arrives" is watched for

V31, V311, V5 = 3, 4, 5
VERSIONS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
PAHO_PROTOCOL = {V31: mqtt.MQTTv31, V311: mqtt.MQTTv311, V5: mqtt.MQTTv5}

# Packet types (fixed header, high nibble).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = range(8, 15)

# MQTT 5 properties used by the tests, and the wire type of every property id.
MESSAGE_EXPIRY_INTERVAL = 0x02
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
WILL_DELAY_INTERVAL = 0x18
RECEIVE_MAXIMUM = 0x21
_PROP_TYPES = {
    **dict.fromkeys((0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A), "byte"),
    **dict.fromkeys((0x13, 0x21, 0x22, 0x23), "u16"),
    **dict.fromkeys((0x02, 0x11, 0x18, 0x27), "u32"),
    0x0B: "varint",
    **dict.fromkeys((0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F), "utf8"),
    **dict.fromkeys((0x09, 0x16), "binary"),
    0x26: "pair",
}
_REPEATABLE = {0x0B, 0x26}


def unique_id(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- encoding


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(raw)) + raw


def encode_properties(props: dict[int, Any] | None) -> bytes:
    out = bytearray()
    for pid, value in (props or {}).items():
        for v in value if pid in _REPEATABLE else [value]:
            kind = _PROP_TYPES[pid]
            out += varint(pid)
            if kind == "byte":
                out.append(v)
            elif kind == "u16":
                out += struct.pack("!H", v)
            elif kind == "u32":
                out += struct.pack("!I", v)
            elif kind == "varint":
                out += varint(v)
            elif kind in ("utf8", "binary"):
                out += utf8(v)
            else:
                out += utf8(v[0]) + utf8(v[1])
    return varint(len(out)) + bytes(out)


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


@dataclass
class WillSpec:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[int, Any] = field(default_factory=dict)


def connect_packet(
    client_id: str = "",
    *,
    version: int = V311,
    clean: bool = True,
    keepalive: int = 60,
    will: WillSpec | None = None,
    username: str | None = None,
    password: bytes | None = None,
    properties: dict[int, Any] | None = None,
    protocol_name: str | None = None,
    reserved_flag: bool = False,
) -> bytes:
    name = protocol_name or ("MQIsdp" if version == V31 else "MQTT")
    flags = (0x02 if clean else 0) | (0x01 if reserved_flag else 0)
    if will:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = utf8(name) + bytes([version, flags]) + struct.pack("!H", keepalive)
    if version == V5:
        body += encode_properties(properties)
    body += utf8(client_id)
    if will:
        if version == V5:
            body += encode_properties(will.properties)
        body += utf8(will.topic) + utf8(will.payload)
    if username is not None:
        body += utf8(username)
    if password is not None:
        body += utf8(password)
    return packet(0x10, body)


def publish_packet(
    topic: str | bytes,
    payload: bytes = b"",
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    version: int = V311,
    properties: dict[int, Any] | None = None,
) -> bytes:
    first = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    body = utf8(topic)
    if qos:
        body += struct.pack("!H", packet_id if packet_id is not None else 1)
    if version == V5:
        body += encode_properties(properties)
    return packet(first, body + payload)


def subscribe_packet(
    packet_id: int,
    filters: list[tuple[str, int]],
    *,
    version: int = V311,
    properties: dict[int, Any] | None = None,
) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_properties(properties)
    for topic, options in filters:
        body += utf8(topic) + bytes([options])
    return packet(0x82, body)


def unsubscribe_packet(packet_id: int, filters: list[str], *, version: int = V311) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += encode_properties({})
    for topic in filters:
        body += utf8(topic)
    return packet(0xA2, body)


def ack_packet(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP with reason "success" (valid in every version)."""
    return packet((kind << 4) | (0x02 if kind == PUBREL else 0), struct.pack("!H", packet_id))


def disconnect_packet(version: int = V311, reason: int = 0) -> bytes:
    if version == V5 and reason:
        return packet(0xE0, bytes([reason]))
    return b"\xe0\x00"


PINGREQ_BYTES = b"\xc0\x00"


# --------------------------------------------------------------------------- decoding


def decode_properties(data: bytes, pos: int) -> tuple[dict[int, Any], int]:
    length, pos = read_varint(data, pos)
    end = pos + length
    props: dict[int, Any] = {}
    while pos < end:
        pid, pos = read_varint(data, pos)
        kind = _PROP_TYPES[pid]
        if kind == "byte":
            value, pos = data[pos], pos + 1
        elif kind == "u16":
            value, pos = struct.unpack_from("!H", data, pos)[0], pos + 2
        elif kind == "u32":
            value, pos = struct.unpack_from("!I", data, pos)[0], pos + 4
        elif kind == "varint":
            value, pos = read_varint(data, pos)
        elif kind in ("utf8", "binary"):
            value, pos = read_bytes(data, pos)
            value = value.decode() if kind == "utf8" else value
        else:
            name, pos = read_bytes(data, pos)
            val, pos = read_bytes(data, pos)
            value = (name.decode(), val.decode())
        if pid in _REPEATABLE:
            props.setdefault(pid, []).append(value)
        else:
            props[pid] = value
    return props, end


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from("!H", data, pos)
    return bytes(data[pos + 2 : pos + 2 + n]), pos + 2 + n


@dataclass
class RawPacket:
    """One packet read off the wire, with the fields the tests look at decoded."""

    type: int
    flags: int
    body: bytes
    version: int = V311
    # CONNACK / DISCONNECT / acks
    reason_code: int = 0
    session_present: bool = False
    properties: dict[int, Any] = field(default_factory=dict)
    # PUBLISH
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    dup: bool = False
    retain: bool = False
    packet_id: int | None = None
    # SUBACK / UNSUBACK
    reason_codes: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, first: int, body: bytes, version: int) -> RawPacket:
        p = cls(type=first >> 4, flags=first & 0x0F, body=body, version=version)
        v5 = version == V5
        if p.type == CONNACK:
            p.session_present = bool(body[0] & 1)
            p.reason_code = body[1]
            if v5 and len(body) > 2:
                p.properties, _ = decode_properties(body, 2)
        elif p.type == PUBLISH:
            p.qos, p.dup, p.retain = (first >> 1) & 3, bool(first & 8), bool(first & 1)
            topic, pos = read_bytes(body, 0)
            p.topic = topic.decode()
            if p.qos:
                p.packet_id, pos = struct.unpack_from("!H", body, pos)[0], pos + 2
            if v5:
                p.properties, pos = decode_properties(body, pos)
            p.payload = bytes(body[pos:])
        elif p.type in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            p.packet_id = struct.unpack_from("!H", body)[0]
            p.reason_code = body[2] if len(body) > 2 else 0
        elif p.type in (SUBACK, UNSUBACK):
            p.packet_id = struct.unpack_from("!H", body)[0]
            pos = decode_properties(body, 2)[1] if v5 else 2
            p.reason_codes = list(body[pos:])
        elif p.type == DISCONNECT and body:
            p.reason_code = body[0]
        return p


# --------------------------------------------------------------------------- raw client


class RawClient:
    """A blocking socket speaking just enough MQTT to test the broker byte by byte."""

    def __init__(self, host: str, port: int, version: int = V311) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = version
        self._buf = bytearray()
        self._eof = False
        self._ids = itertools.count(1)
        self.stash: list[RawPacket] = []

    # -- bytes

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False at EOF. Raises TimeoutError at the deadline."""
        if self._eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no packet from the broker in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no packet from the broker in time") from None
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def read_packet(self, timeout: float = TIMEOUT) -> RawPacket | None:
        """The next packet, or None when the broker closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            parsed = self._split()
            if parsed:
                return parsed
            if not self._fill(deadline):
                return None

    def _split(self) -> RawPacket | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        length, shift, pos = 0, 0, 1
        while True:
            if pos >= len(buf):
                return None
            byte = buf[pos]
            length |= (byte & 0x7F) << shift
            shift += 7
            pos += 1
            if not byte & 0x80:
                break
        if len(buf) < pos + length:
            return None
        first, body = buf[0], bytes(buf[pos : pos + length])
        del buf[: pos + length]
        return RawPacket.parse(first, body, self.version)

    def expect(self, ptype: int, timeout: float = TIMEOUT) -> RawPacket:
        """The next packet of type `ptype`.

        PUBLISH packets that arrive while waiting for another type (e.g. our own message
        coming back before its PUBACK; their order is not specified) are kept for later
        `expect(PUBLISH)` calls."""
        if ptype == PUBLISH and self.stash:
            return self.stash.pop(0)
        while True:
            pkt = self.read_packet(timeout)
            assert pkt is not None, f"connection closed while waiting for packet type {ptype}"
            if pkt.type == PUBLISH and ptype != PUBLISH:
                self.stash.append(pkt)
                continue
            assert pkt.type == ptype, f"expected packet type {ptype}, got {pkt}"
            return pkt

    def expect_closed(self, timeout: float = TIMEOUT) -> list[RawPacket]:
        """Wait for the broker to close the connection; return what it sent before."""
        got, self.stash = self.stash, []
        while (pkt := self.read_packet(timeout)) is not None:
            got.append(pkt)
        return got

    def expect_silence(self, timeout: float = QUIET) -> None:
        """Assert that no packet arrives (and the connection stays open) for `timeout`."""
        assert not self.stash, f"expected silence, have {self.stash}"
        try:
            pkt = self.read_packet(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got {pkt or 'EOF'}")

    def is_open(self, timeout: float = TIMEOUT) -> bool:
        """Round-trip a PINGREQ: True if the PINGRESP comes back."""
        try:
            self.send(PINGREQ_BYTES)
            pkt = self.read_packet(timeout)
        except OSError:
            return False
        return pkt is not None and pkt.type == PINGRESP

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- MQTT steps

    def connect(
        self, client_id: str = "", *, expect_code: int | None = 0, **kwargs: Any
    ) -> RawPacket:
        """Send CONNECT and return the CONNACK (asserting its code unless None)."""
        kwargs.setdefault("version", self.version)
        self.send(connect_packet(client_id, **kwargs))
        connack = self.expect(CONNACK)
        if expect_code is not None:
            assert connack.reason_code == expect_code, connack
        return connack

    def subscribe(
        self, *filters: tuple[str, int], properties: dict[int, Any] | None = None
    ) -> list[int]:
        pid = next(self._ids)
        self.send(subscribe_packet(pid, list(filters), version=self.version, properties=properties))
        suback = self.expect(SUBACK)
        assert suback.packet_id == pid
        return suback.reason_codes

    def publish(self, topic: str, payload: bytes = b"", qos: int = 0, **kwargs: Any) -> None:
        """Publish and complete the QoS flow (PUBACK, or PUBREC/PUBREL/PUBCOMP)."""
        pid = next(self._ids) if qos else None
        self.send(
            publish_packet(topic, payload, qos=qos, packet_id=pid, version=self.version, **kwargs)
        )
        if qos == 1:
            assert self.expect(PUBACK).packet_id == pid
        elif qos == 2:
            assert self.expect(PUBREC).packet_id == pid
            self.send(ack_packet(PUBREL, pid))
            assert self.expect(PUBCOMP).packet_id == pid

    def ack(self, pkt: RawPacket) -> None:
        """Acknowledge a received PUBLISH (QoS 1: PUBACK; QoS 2: the whole flow)."""
        if pkt.qos == 1:
            self.send(ack_packet(PUBACK, pkt.packet_id))
        elif pkt.qos == 2:
            self.send(ack_packet(PUBREC, pkt.packet_id))
            assert self.expect(PUBREL).packet_id == pkt.packet_id
            self.send(ack_packet(PUBCOMP, pkt.packet_id))

    def ack_available(self, gap: float = 0.02) -> list[bytes]:
        """Read the PUBLISHes already on their way (until none comes for `gap` seconds),
        acknowledge each, and return their payloads."""
        payloads = []
        while True:
            try:
                pkt = self.read_packet(timeout=gap)
            except TimeoutError:
                return payloads
            if pkt is None or pkt.type != PUBLISH:
                return payloads
            payloads.append(pkt.payload)
            self.ack(pkt)

    def disconnect(self, reason: int = 0) -> None:
        """Send DISCONNECT and wait until the broker has closed the connection.

        The close is the event that tells the test the broker has processed the DISCONNECT
        (and so, e.g., that the session is now offline)."""
        self.send(disconnect_packet(self.version, reason))
        self.expect_closed()
        self.close()


# --------------------------------------------------------------------------- paho client


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: Any  # paho Properties (v5) or None

    @property
    def subscription_ids(self) -> list[int]:
        if self.properties is None:
            return []
        ids = getattr(self.properties, "SubscriptionIdentifier", [])
        return ids if isinstance(ids, list) else [ids]


@dataclass
class ConnResult:
    reason_code: int
    session_present: bool
    properties: Any


class PahoClient:
    """paho-mqtt with blocking, event-driven steps. Start with `connect()`."""

    def __init__(self, host: str, port: int, version: int = V311, client_id: str | None = None):
        self.host, self.port, self.version = host, port, version
        self.client_id = unique_id("paho") if client_id is None else client_id
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()
        self._connacks: queue.Queue[ConnResult] = queue.Queue()
        self._acks: dict[int, list[int]] = {}
        self._cond = threading.Condition()
        self.client: mqtt.Client | None = None

    # -- callbacks (paho's network thread)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connacks.put(ConnResult(reason_code.value, flags.session_present, properties))

    def _on_message(self, client, userdata, msg) -> None:
        props = msg.properties if self.version == V5 else None
        self.messages.put(Received(msg.topic, msg.payload, msg.qos, msg.retain, msg.dup, props))

    def _on_ack(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._cond:
            self._acks[mid] = [rc.value for rc in reason_codes]
            self._cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnects.put(reason_code.value)

    # -- steps

    def connect(
        self,
        *,
        clean: bool = True,
        keepalive: int = 60,
        session_expiry: int | None = None,
        properties: dict[str, Any] | None = None,
        will: WillSpec | None = None,
        expect_code: int | None = 0,
        username: str | None = None,
        password: str | bytes | None = None,
    ) -> ConnResult:
        """Connect and wait for the CONNACK. `properties`: paho CONNECT property names."""
        v5 = self.version == V5
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if v5 else clean,
            protocol=PAHO_PROTOCOL[self.version],
            reconnect_on_failure=False,
        )
        c = self.client
        c.on_connect, c.on_message, c.on_disconnect = (
            self._on_connect,
            self._on_message,
            self._on_disconnect,
        )
        c.on_subscribe = c.on_unsubscribe = self._on_ack
        if username is not None or password is not None:
            c.username_pw_set(username, password)
        if will:
            will_props = None
            if v5 and will.properties:
                will_props = Properties(PacketTypes.WILLMESSAGE)
                for name, value in will.properties.items():
                    setattr(will_props, name, value)
            c.will_set(will.topic, will.payload, will.qos, will.retain, will_props)
        kwargs: dict[str, Any] = {}
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                props.SessionExpiryInterval = session_expiry
            for name, value in (properties or {}).items():
                setattr(props, name, value)
            kwargs = {"clean_start": clean, "properties": props}
        c.connect(self.host, self.port, keepalive, **kwargs)
        c.loop_start()
        result = self._connacks.get(timeout=TIMEOUT)
        if expect_code is not None:
            assert result.reason_code == expect_code, result
        return result

    def _wait_ack(self, mid: int) -> list[int]:
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self._acks, TIMEOUT), "no SUBACK/UNSUBACK"
            return self._acks.pop(mid)

    def subscribe(
        self,
        topic: str | list[tuple[str, int]],
        qos: int = 0,
        *,
        sub_id: int | None = None,
        options: SubscribeOptions | None = None,
    ) -> list[int]:
        """Subscribe and return the SUBACK's codes."""
        assert self.client is not None
        if self.version == V5:
            props = None
            if sub_id is not None:
                props = Properties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = sub_id
            if isinstance(topic, list):
                topic = [(t, SubscribeOptions(qos=q)) for t, q in topic]
                rc, mid = self.client.subscribe(topic, properties=props)
            else:
                opts = options or SubscribeOptions(qos=qos)
                rc, mid = self.client.subscribe(topic, options=opts, properties=props)
        else:
            rc, mid = self.client.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(mid)

    def unsubscribe(self, topic: str) -> list[int]:
        assert self.client is not None
        rc, mid = self.client.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(mid)

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Publish and wait for the flow to complete (PUBACK / PUBCOMP / written)."""
        assert self.client is not None
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"publish to {topic!r} (QoS {qos}) not acknowledged"

    def expect_message(self, timeout: float = TIMEOUT) -> Received:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message arrived in time") from None

    def expect_no_message(self, timeout: float = QUIET) -> None:
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {msg}")

    def collect_until(self, payload: bytes, timeout: float = TIMEOUT) -> list[Received]:
        """Messages received up to and including the first with `payload` (a sentinel)."""
        got = []
        while True:
            msg = self.expect_message(timeout)
            got.append(msg)
            if msg.payload == payload:
                return got

    def expect_disconnected(self, timeout: float = TIMEOUT) -> int:
        """Wait until the broker dropped us; returns paho's reason code value."""
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the broker did not disconnect the client") from None

    def disconnect(self) -> None:
        assert self.client is not None
        self.client.disconnect()
        self.expect_disconnected()
        self.client.loop_stop()
        self.client = None

    def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.disconnect()
            self.client.loop_stop()
            self.client = None


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def paho_client():
    """paho_client(server, version=4, client_id=None, **connect_kwargs) -> connected client.

    Pass connect=False to get an unconnected PahoClient. All are closed after the test."""
    made: list[PahoClient] = []

    def make(server, version: int = V311, client_id: str | None = None, *, connect=True, **kw):
        client = PahoClient(server.host, server.port, version, client_id)
        made.append(client)
        if connect:
            client.connect(**kw)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def raw_client():
    """raw_client(server, version=4) -> RawClient (TCP connected, nothing sent yet)."""
    made: list[RawClient] = []

    def make(server, version: int = V311) -> RawClient:
        client = RawClient(server.host, server.port, version)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
