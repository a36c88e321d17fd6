"""The Courier sidecar push: Courier's frames byte for byte, and a real sidecar (a TCP server
here that decodes every frame with the eventssidecar.v1 classes) receiving every event type,
in order per client, after an outage, and with events the log let go of counted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from event_relay import sidecar
from event_relay.config import SidecarConfig
from event_relay.log import SEGMENT, EventLog
from event_relay.schema import CODES, decode_event
from event_relay.sidecar import SidecarPush, encode_frame
from event_relay.sidecar_pb import disconnect_reason_pb2 as disconnect
from event_relay.sidecar_pb import registration_failure_reason_pb2 as registration
from event_relay.sidecar_pb.matched_acl_pb2 import MatchedACL
from event_relay.sidecar_pb.on_client_gone_pb2 import OnClientGone
from event_relay.sidecar_pb.on_client_offline_pb2 import OnClientOffline
from event_relay.sidecar_pb.on_client_wakeup_pb2 import OnClientWakeUp
from event_relay.sidecar_pb.on_deliver_pb2 import OnDeliver
from event_relay.sidecar_pb.on_delivery_complete_pb2 import OnDeliveryComplete
from event_relay.sidecar_pb.on_message_drop_pb2 import OnMessageDrop
from event_relay.sidecar_pb.on_offline_message_pb2 import OnOfflineMessage
from event_relay.sidecar_pb.on_publish_pb2 import OnPublish
from event_relay.sidecar_pb.on_register_failed_pb2 import OnRegisterFailed
from event_relay.sidecar_pb.on_register_pb2 import OnRegister
from event_relay.sidecar_pb.on_session_expired_pb2 import OnSessionExpired
from event_relay.sidecar_pb.on_subscribe_pb2 import OnSubscribe, TopicInfo
from event_relay.sidecar_pb.on_unsubscribe_pb2 import OnUnsubscribe

WAIT = 5.0  # seconds a test waits for the sidecar to receive what it expects
TS = 1_700_000_000 * 10**9 + 5
STAMP = Timestamp(seconds=1_700_000_000, nanos=5)
SESSION = "96366244-e848-4ef4-82c1-5ee7c5cf8102"

MESSAGES: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        OnRegister,
        OnRegisterFailed,
        OnPublish,
        OnSubscribe,
        OnUnsubscribe,
        OnDeliver,
        OnDeliveryComplete,
        OnOfflineMessage,
        OnMessageDrop,
        OnClientWakeUp,
        OnClientOffline,
        OnClientGone,
        OnSessionExpired,
    )
}


# -- a sidecar as Courier's are written: length-prefixed Any frames in, nothing out ------


class Sidecar:
    """Collects every frame as (connection number, message name, decoded message)."""

    def __init__(self) -> None:
        self.received: list[tuple[int, str, Any]] = []
        self._arrived = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.reading = asyncio.Event()  # cleared: connections are not read (a stuck sidecar)
        self.reading.set()

    async def start(self, sock: socket.socket | None = None) -> int:
        if sock is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        else:
            self._server = await asyncio.start_server(self._serve, sock=sock)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(self._writers)
        self._writers.append(writer)
        writer.write(b"sidecars may answer; the push ignores it")
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await self.reading.wait()
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                envelope = AnyMessage.FromString(await reader.readexactly(size))
                prefix, _, name = envelope.type_url.rpartition("/")
                assert prefix == "type.googleapis.com", envelope.type_url
                message = MESSAGES[name]()
                assert envelope.Unpack(message)
                async with self._arrived:
                    self.received.append((number, type(message).__name__, message))
                    self._arrived.notify_all()

    async def wait(self, count: int) -> list[tuple[int, str, Any]]:
        """Until `count` frames have arrived (not one more is waited for)."""
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.received) >= count), WAIT
            )
        return self.received

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()


@contextlib.asynccontextmanager
async def running(log: EventLog, port: int, **config: Any) -> AsyncIterator[SidecarPush]:
    push = SidecarPush(SidecarConfig(enabled=True, port=port, **config), log)
    push.start()
    try:
        yield push
    finally:
        await push.stop()
    assert push.connected == 0


async def until(condition: Callable[[], bool]) -> None:
    """For the push's own state, which no frame shows: checked every few ms, WAIT at most."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.005)


def memory_log(events: int = 100_000) -> EventLog:
    return EventLog(memory_events=events, memory_bytes=1 << 30)


def common(client_id: str, username: str | None = None, session_id: str = SESSION) -> list[Any]:
    """The places of seq and type (filled by the log), then the common fields."""
    return [0, TS, 0, client_id, "", username, session_id]


def publish(client_id: str, payload: bytes | None, topic: str = "t") -> list[Any]:
    size = None if payload is None else len(payload)
    return [*common(client_id), topic, 1, False, size, payload, "", ""]


def one_of_each() -> list[tuple[str, list[Any]]]:
    """An event of every type, laid out as event_relay/plugin.py lays them out."""
    message = ["a/b", 1, True, 5, b"hello"]
    return [
        (
            "on_register",
            [*common("c", "alice"), "10.0.0.1", 5000, True, 4, [["k1", "v1"], ["k2", "v2"]]],
        ),
        ("on_register_failed", [*common("c", "alice"), "::1", 5001, False, 4, "invalid_signature"]),
        ("on_publish", [*common("c", "alice"), *message, "fleet", "fleet/+/c"]),
        (
            "on_subscribe",
            [*common("c", "alice"), [["a/#", 1, "lbl", "a/#"], ["secret/#", 128, "", ""]]],
        ),
        ("on_unsubscribe", [*common("c", "alice"), ["a/#", "b/+"]]),
        ("on_deliver", [*common("c", "alice"), *message, "", True]),
        ("on_delivery_complete", [*common("c"), "a/b", 2, False, None, None, "lbl", False]),
        ("on_offline_message", [*common("c"), *message]),
        ("on_message_drop", [*common("c", session_id=""), *message, "queue_full", "lbl"]),
        ("on_client_wakeup", common("c")),
        ("on_client_offline", [*common("c", "alice"), "session_taken_over"]),
        ("on_client_gone", [*common("c"), "no_such_reason"]),
        ("on_session_expired", [*common("c", session_id="")]),
    ]


# -- Courier's bytes ---------------------------------------------------------------------

WAKEUP_C1 = bytes.fromhex(
    "00 00 00 45 0a 33 74 79 70 65 2e 67 6f 6f 67 6c 65 61 70 69 73 2e 63 6f 6d 2f"
    "65 76 65 6e 74 73 73 69 64 65 63 61 72 2e 76 31 2e 4f 6e 43 6c 69 65 6e 74 57"
    "61 6b 65 55 70 12 0e 0a 08 08 80 e2 cf aa 06 10 05 12 02 63 31"
)


def frame_of(values: list[Any]) -> bytes:
    """Through the log's encoding, as the push reads events."""
    log = memory_log()
    log.append(CODES["on_client_wakeup"], values)
    raws, _ = log.read(1, 1)
    return encode_frame(decode_event(msgpack.unpackb(raws[0])))


def test_worked_example_is_byte_exact() -> None:
    frame = frame_of([0, TS, 0, "c1", "", None, ""])
    assert len(frame) == 73
    assert frame == WAKEUP_C1


def test_worked_example_with_session_id() -> None:
    frame = frame_of([0, TS, 0, "c1", "", None, SESSION])
    expected = (
        bytes.fromhex("00 00 00 6b")
        + WAKEUP_C1[4:57]  # 0a 33 and the type_url
        + bytes.fromhex("12 34")  # the message is 52 bytes now
        + WAKEUP_C1[59:]
        + bytes.fromhex("22 24")
        + SESSION.encode()
    )
    assert len(frame) == 111
    assert frame == expected


def test_refused_topic_keeps_an_empty_matched_acl_on_the_wire() -> None:
    values = [*common("c"), [["x", 128, "", ""]]]
    event = decode_event([1, TS, CODES["on_subscribe"], *values[3:]])
    envelope = AnyMessage.FromString(encode_frame(event)[4:])
    topic = OnSubscribe.FromString(envelope.value).topics[0]
    assert topic.SerializeToString() == b"\x0a\x01x\x10\x80\x01\x1a\x00"


# -- a real sidecar ----------------------------------------------------------------------


def test_every_event_type_decoded_by_a_sidecar() -> None:
    async def scenario() -> dict[str, Any]:
        server = Sidecar()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, pool_size=2):
                for hook, values in one_of_each():
                    log.append(CODES[hook], values)
                received = await server.wait(13)
        finally:
            await server.close()
        assert len(received) == 13
        return {name: message for _, name, message in received}

    got = asyncio.run(scenario())
    acl = MatchedACL(name="fleet", pattern="fleet/+/c")
    assert got["OnRegister"] == OnRegister(
        timestamp=STAMP,
        peer_addr="10.0.0.1",
        peer_port=5000,
        username="alice",
        client_id="c",
        user_properties={"k1": "v1", "k2": "v2"},
        session_id=SESSION,
    )
    assert got["OnRegisterFailed"] == OnRegisterFailed(
        timestamp=STAMP,
        client_id="c",
        peer_addr="::1",
        peer_port=5001,
        username="alice",
        clean_session=False,
        reason=registration.REGISTRATION_FAILURE_REASON_INVALID_SIGNATURE,
    )
    assert got["OnPublish"] == OnPublish(
        timestamp=STAMP,
        username="alice",
        client_id="c",
        qos=1,
        topic="a/b",
        payload=b"hello",
        retain=True,
        matched_acl=acl,
        session_id=SESSION,
    )
    assert got["OnSubscribe"] == OnSubscribe(
        timestamp=STAMP,
        client_id="c",
        username="alice",
        topics=[
            TopicInfo(topic="a/#", qos=1, matched_acl=MatchedACL(name="lbl", pattern="a/#")),
            TopicInfo(topic="secret/#", qos=128, matched_acl=MatchedACL()),
        ],
        session_id=SESSION,
    )
    assert got["OnSubscribe"].topics[1].HasField("matched_acl")
    assert got["OnUnsubscribe"] == OnUnsubscribe(
        timestamp=STAMP,
        username="alice",
        client_id="c",
        topics=["a/#", "b/+"],
        session_id=SESSION,
    )
    assert got["OnDeliver"] == OnDeliver(
        timestamp=STAMP,
        username="alice",
        client_id="c",
        topic="a/b",
        qos=1,
        is_retain=True,
        payload=b"hello",
        matched_acl=MatchedACL(),
        persisted=True,
        session_id=SESSION,
    )
    assert got["OnDeliver"].HasField("matched_acl")  # present though empty, as Courier's
    complete = got["OnDeliveryComplete"]
    assert complete == OnDeliveryComplete(
        timestamp=STAMP,
        client_id="c",
        topic="a/b",
        qos=2,
        matched_acl=MatchedACL(name="lbl"),
        session_id=SESSION,
    )
    assert complete.payload == b""  # the log kept no payload (payloads = "none")
    assert got["OnOfflineMessage"] == OnOfflineMessage(
        timestamp=STAMP,
        client_id="c",
        qos=1,
        topic="a/b",
        payload=b"hello",
        retain=True,
        session_id=SESSION,
    )
    drop = got["OnMessageDrop"]
    assert drop == OnMessageDrop(
        timestamp=STAMP,
        client_id="c",
        qos=1,
        topic="a/b",
        payload=b"hello",
        reason="queue_full",
        matched_acl=MatchedACL(name="lbl"),
    )
    assert not drop.session_id
    assert got["OnClientWakeUp"] == OnClientWakeUp(
        timestamp=STAMP, client_id="c", session_id=SESSION
    )
    assert got["OnClientOffline"] == OnClientOffline(
        timestamp=STAMP,
        client_id="c",
        reason=disconnect.REASON_SESSION_TAKEN_OVER,
        username="alice",
        session_id=SESSION,
    )
    gone = got["OnClientGone"]
    assert gone == OnClientGone(timestamp=STAMP, client_id="c", session_id=SESSION)
    assert gone.reason == disconnect.REASON_UNSPECIFIED  # not one of Courier's reasons
    assert got["OnSessionExpired"] == OnSessionExpired(timestamp=STAMP, client_id="c")
    assert all(message.HasField("timestamp") for message in got.values())


def test_disconnect_reasons_map_to_courier_enum() -> None:
    def reason(name: str) -> int:
        event = decode_event([1, TS, CODES["on_client_offline"], "c", "", None, "", name])
        message = OnClientOffline()
        assert AnyMessage.FromString(encode_frame(event)[4:]).Unpack(message)
        return int(message.reason)

    assert reason("normal_disconnect") == disconnect.REASON_NORMAL_DISCONNECT == 2
    assert reason("disconnect_keep_alive") == disconnect.REASON_DISCONNECT_KEEP_ALIVE == 5
    assert reason("tcp_closed") == disconnect.REASON_TCP_CLOSED == 17
    assert reason("publish_not_authorized_3_1_1") == disconnect.REASON_PUBLISH_AUTH_ERROR == 12
    assert reason("") == 0


def test_order_per_client_over_four_connections() -> None:
    # Clients chosen so that every connection of the pool carries some of them.
    clients: dict[int, list[str]] = {}
    for n in range(1000):
        client = f"client-{n}"
        clients.setdefault(zlib.crc32(client.encode()) % 4, []).append(client)
        if all(len(clients.get(i, ())) >= 2 for i in range(4)):
            break
    names = [c for group in clients.values() for c in group[:2]]
    per_client = 300

    async def scenario() -> list[tuple[int, str, Any]]:
        server = Sidecar()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, pool_size=4) as push:
                await until(lambda: push.connected == 4)
                for i in range(per_client):
                    for name in names:
                        log.append(CODES["on_publish"], publish(name, str(i).encode()))
                    if i % 50 == 0:
                        await asyncio.sleep(0)  # let some go out while more are appended
                received = await server.wait(per_client * len(names))
                assert push.sent == per_client * len(names)
        finally:
            await server.close()
        return received

    received = asyncio.run(scenario())
    connections: dict[str, set[int]] = {}
    payloads: dict[str, list[int]] = {}
    for number, _, message in received:
        connections.setdefault(message.client_id, set()).add(number)
        payloads.setdefault(message.client_id, []).append(int(message.payload))
    assert all(p == list(range(per_client)) for p in payloads.values())
    assert all(len(c) == 1 for c in connections.values())  # one client, one connection
    assert len(set.union(*connections.values())) == 4


def unreachable() -> socket.socket:
    """A port nobody listens on (yet): connects are refused until it is listened on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_sidecar_down_at_start(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setattr(sidecar, "RECONNECT_MIN", 0.01)
    caplog.set_level(logging.INFO, logger="nautilus.event_relay")

    async def scenario() -> list[tuple[int, str, Any]]:
        sock = unreachable()
        server = Sidecar()
        log = memory_log()
        try:
            async with running(log, sock.getsockname()[1], pool_size=1) as push:
                for i in range(20):
                    log.append(CODES["on_publish"], publish("c", str(i).encode()))
                await until(lambda: push.errors >= 3)  # it kept trying
                assert push.sent == 0 and push.connected == 0
                await server.start(sock)
                received = await server.wait(20)
                assert push.sent == 20 and push.dropped == 0
        finally:
            await server.close()
            sock.close()
        return received

    received = asyncio.run(scenario())
    assert [int(message.payload) for _, _, message in received] == list(range(20))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, however many retries
    assert "connection 0 is down" in warnings[0].getMessage()
    assert any("up again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_events_the_log_let_go_of_are_counted(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setattr(sidecar, "RECONNECT_MIN", 0.01)
    total = 2 * SEGMENT + 100  # memory keeps one segment: the last 100 events

    async def scenario() -> tuple[SidecarPush, list[tuple[int, str, Any]]]:
        sock = unreachable()
        server = Sidecar()
        log = memory_log(events=SEGMENT)
        try:
            async with running(log, sock.getsockname()[1], pool_size=1) as push:
                for i in range(total):
                    log.append(CODES["on_publish"], publish("c", str(i).encode()))
                await until(lambda: push.errors >= 1)
                assert log.first_seq == 2 * SEGMENT + 1
                await server.start(sock)
                await server.wait(100)
                log.append(CODES["on_publish"], publish("c", b"later"))
                received = await server.wait(101)
        finally:
            await server.close()
            sock.close()
        return push, received

    push, received = asyncio.run(scenario())
    assert push.dropped == 2 * SEGMENT
    payloads = [message.payload for _, _, message in received]
    assert payloads == [str(i).encode() for i in range(2 * SEGMENT, total)] + [b"later"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert f"{2 * SEGMENT} events (from 1) left the log" in errors[0]


def test_only_the_configured_hooks_are_sent() -> None:
    async def scenario() -> list[str]:
        server = Sidecar()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, hooks=["on_publish", "on_client_gone"]):
                for hook, values in one_of_each():
                    log.append(CODES[hook], values)
                log.append(CODES["on_publish"], publish("c", b"last"))  # same client: after
                received = await server.wait(3)
        finally:
            await server.close()
        return [name for _, name, _ in received]

    assert asyncio.run(scenario()) == ["OnPublish", "OnClientGone", "OnPublish"]


def test_a_stuck_sidecar_holds_the_push_within_the_backlog() -> None:
    count = 200
    payload = bytes(256 * 1024)  # 50 MB in all: more than the socket buffers hold

    async def scenario() -> tuple[SidecarPush, list[tuple[int, str, Any]]]:
        server = Sidecar()
        server.reading.clear()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, pool_size=1, backlog_size=4) as push:
                for i in range(count):
                    log.append(CODES["on_publish"], publish("c", payload, topic=str(i)))
                await until(lambda: push.sent > 0 and push._waiting_for is not None)
                assert push.sent < count  # the push waits: nothing is dropped
                connection = push._pool[0]
                assert len(connection.frames) + connection.writing <= 4
                server.reading.set()
                received = await server.wait(count)
        finally:
            await server.close()
        return push, received

    push, received = asyncio.run(scenario())
    assert [message.topic for _, _, message in received] == [str(i) for i in range(count)]
    assert push.sent == count and push.dropped == 0


def test_stop_never_hangs_on_a_stuck_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sidecar, "CLOSE_TIMEOUT", 0.05)

    async def scenario() -> None:
        server = Sidecar()
        server.reading.clear()
        port = await server.start()
        log = memory_log()
        config = SidecarConfig(enabled=True, port=port, pool_size=1, backlog_size=4)
        push = SidecarPush(config, log)
        push.start()
        try:
            for i in range(200):
                log.append(CODES["on_publish"], publish("c", bytes(256 * 1024), topic=str(i)))
            # Written, and the rest waits behind a write the sidecar does not take.
            await until(lambda: push.sent > 0 and push._waiting_for is not None)
            await asyncio.wait_for(push.stop(), WAIT)
            assert push.connected == 0
        finally:
            server.reading.set()
            await server.close()

    asyncio.run(scenario())


def test_an_event_that_cannot_be_encoded_is_counted_not_fatal(caplog: Any) -> None:
    async def scenario() -> tuple[SidecarPush, list[tuple[int, str, Any]]]:
        server = Sidecar()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, pool_size=1) as push:
                bad = publish("c", b"bad")
                bad[8] = "not a qos"
                log.append(CODES["on_publish"], bad)
                log.append(CODES["on_publish"], publish("c", b"good"))
                received = await server.wait(1)
        finally:
            await server.close()
        return push, received

    push, received = asyncio.run(scenario())
    assert [message.payload for _, _, message in received] == [b"good"]
    assert push.dropped == 1
    assert any("event not sent" in r.getMessage() for r in caplog.records)
