"""An asyncio MQTT client over the broker's own sans-I/O codec (broker.protocol), for the
bridge's two sides: 3.1, 3.1.1 or 5; QoS 0, 1 and 2 both ways; keepalive.

    client = await MqttClient.connect(endpoint, Connect(...), on_message)
    codes = await client.subscribe([Subscription("a/#", 1)])
    await client.publish(Publish("a/b", b"x", qos=1))   # returns once acknowledged
    await client.closed                                  # the reason it ended

Incoming PUBLISHes go to `on_message` (a plain callable) once each, acknowledged as
their QoS asks. `try_private` (VerneMQ's and Mosquitto's bridge bit) sets 0x80 in the
CONNECT's protocol level: a broker that knows it does not send the bridge's own messages
back to it. Any error closes the connection; `closed` then holds why, in one line.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from broker.protocol import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    PingReq,
    PingResp,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)

CONNACK_TIMEOUT = 30.0  # seconds a broker may take to answer a CONNECT
BRIDGE_BIT = 0x80
_NAME_END = {3: 2 + 6, 4: 2 + 4, 5: 2 + 4}  # after the protocol name: MQIsdp / MQTT


class MqttError(Exception):
    """The connection could not be made, or ended: one line saying why."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    ssl: ssl.SSLContext | None = None
    server_hostname: str | None = None  # SNI and the name checked (TLS)


class MqttClient(asyncio.Protocol):
    def __init__(self, level: int, on_message: Callable[[Publish], None]) -> None:
        self.level = level
        self.on_message = on_message
        self.decoder = Decoder(role="client", protocol_level=level)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[ConnAck] = loop.create_future()
        self.closed: asyncio.Future[str] = loop.create_future()
        self._waiting: dict[tuple[type, int], asyncio.Future[Any]] = {}
        self._next_id = 0
        self._incoming_qos2: set[int] = set()  # PUBRECed, waiting for their PUBREL
        self._pong = asyncio.Event()
        self._pinger: asyncio.Task[None] | None = None

    # -- making one -----------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        endpoint: Endpoint,
        packet: Connect,
        on_message: Callable[[Publish], None],
        try_private: bool = False,
    ) -> tuple[MqttClient, ConnAck]:
        """A connected client and the CONNACK it got (check its reason code)."""
        loop = asyncio.get_running_loop()
        try:
            _, client = await asyncio.wait_for(
                loop.create_connection(
                    lambda: cls(packet.protocol_level, on_message),
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl,
                    server_hostname=endpoint.server_hostname if endpoint.ssl else None,
                ),
                CONNACK_TIMEOUT,
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            where = f"{endpoint.host}:{endpoint.port}"
            raise MqttError(f"cannot connect to {where}: {_line(exc)}") from None
        wire = bytearray(encode(packet, packet.protocol_level))
        if try_private:
            wire[wire.index(0x00, 1) + _NAME_END[packet.protocol_level]] |= BRIDGE_BIT
        client._send(bytes(wire))
        try:
            connack = await asyncio.wait_for(asyncio.shield(client.connack), CONNACK_TIMEOUT)
        except TimeoutError:
            client.close()
            raise MqttError(f"no CONNACK from {endpoint.host}:{endpoint.port}") from None
        if packet.keepalive:
            client._pinger = loop.create_task(client._ping_forever(packet.keepalive))
        return client, connack

    # -- using it -------------------------------------------------------------------------

    async def subscribe(self, subscriptions: list[Subscription]) -> list[int]:
        packet_id = self._packet_id()
        suback = await self._request(Subscribe(packet_id, subscriptions), SubAck, packet_id)
        return list(suback.reason_codes)

    def publish_now(self, messages: list[Publish]) -> None:
        """Send QoS 0 `messages` (nothing comes back for them) in one write."""
        level = self.level
        self._send(b"".join([encode(message, level) for message in messages]))

    async def publish(self, message: Publish) -> int:
        """Send `message`; for QoS 1 and 2, return once the broker has it (the reason code
        of its PUBACK or PUBREC: 0x80 and up refused it)."""
        if message.qos == 0:
            self.publish_now([message])
            return 0
        message.packet_id = self._packet_id()
        answer = PubAck if message.qos == 1 else PubRec
        ack = await self._request(message, answer, message.packet_id)
        if message.qos == 2 and ack.reason_code < 0x80:
            await self._request(PubRel(message.packet_id), PubComp, message.packet_id)
        return int(ack.reason_code)

    def close(self, reason: str = "closed") -> None:
        if self.transport is not None and not self.transport.is_closing():
            if reason == "closed":  # ours: a clean DISCONNECT first
                self._send(encode(Disconnect(), self.level))
            self.transport.close()
        self._finish(reason)

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        try:
            while (packet := self.decoder.next_packet()) is not None:
                self._handle(packet)
        except ProtocolError as exc:
            self.close(f"protocol error from the broker: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(f"connection lost: {_line(exc)}" if exc else "closed by the broker")

    # -- inside ---------------------------------------------------------------------------

    def _handle(self, packet: Any) -> None:
        kind = type(packet)
        if kind is Publish:
            self._received(packet)
        elif kind is ConnAck:
            if not self.connack.done():
                self.connack.set_result(packet)
        elif kind is PubRel:
            self._incoming_qos2.discard(packet.packet_id)
            self._send(encode(PubComp(packet.packet_id), self.level))
        elif kind is PingResp:
            self._pong.set()
        elif kind is Disconnect:
            self.close(f"the broker disconnected (reason 0x{packet.reason_code:02x})")
        else:  # an answer: SUBACK, PUBACK, PUBREC, PUBCOMP
            waiter = self._waiting.pop((kind, packet.packet_id), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(packet)

    def _received(self, message: Publish) -> None:
        if message.qos == 1:
            self._send(encode(PubAck(message.packet_id or 0), self.level))
        elif message.qos == 2:
            packet_id = message.packet_id or 0
            self._send(encode(PubRec(packet_id), self.level))
            if packet_id in self._incoming_qos2:
                return  # a resent one we already have: delivered once
            self._incoming_qos2.add(packet_id)
        self.on_message(message)

    async def _request(self, packet: Any, answer: type, packet_id: int) -> Any:
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[(answer, packet_id)] = waiter
        self._send(encode(packet, self.level))
        done, _ = await asyncio.wait([waiter, self.closed], return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        self._waiting.pop((answer, packet_id), None)
        raise MqttError(self.closed.result())

    def _packet_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if not any(key[1] == self._next_id for key in self._waiting):
                return self._next_id
        raise MqttError("no packet identifier free")

    async def _ping_forever(self, keepalive: int) -> None:
        while not self.closed.done():
            await asyncio.sleep(keepalive)
            self._pong.clear()
            self._send(encode(PingReq(), self.level))
            try:
                await asyncio.wait_for(self._pong.wait(), keepalive)
            except TimeoutError:
                self.close(f"no PINGRESP in {keepalive} s")

    def _send(self, wire: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire)

    def _finish(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        if not self.connack.done():
            self.connack.set_exception(MqttError(reason))
            self.connack.exception()  # retrieved: connect() reports it its own way
        if self._pinger is not None and self._pinger is not asyncio.current_task():
            self._pinger.cancel()
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()


def _line(exc: BaseException | None) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
