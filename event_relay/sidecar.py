"""Courier's events sidecar, fed from the relay log: a sidecar written for Courier
(gojek/vernemq's vmq_events_sidecar) runs unchanged against Nautilus.

The wire is Courier's (docs/event-relay.md, "Courier's sidecar push"): plain TCP
connections from us to the sidecar, each event one frame of a 4-byte big-endian length and
a serialized google.protobuf.Any whose value is the eventssidecar.v1 message. Nothing is
read back; whatever the sidecar sends is discarded.

Where we differ, on purpose:
- Courier casts each event to a connection picked at random and loses it when that one is
  down or its backlog is full. Here one cursor reads the log in order and sends each event
  on the connection its client id hashes to (crc32), so one client's events keep their
  order. When that connection is down or its backlog full, the cursor waits, and with it
  the events of every connection (there is one cursor); they wait in the log, which is
  bounded: those it lets go of before we took them are counted in `dropped` and logged,
  never skipped silently.
- Frames wait in a backlog of `backlog_size` per connection, kept across a reconnect.
  Frames already written to a connection that then breaks may be lost, as with Courier
  (shackle counts a request done once gen_tcp:send returns).

Nothing here awaits on the broker's behalf: the log's callback only schedules the cursor,
which moves at most BATCH events per loop turn; the waiting is in the connection tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from event_relay.config import SidecarConfig
from event_relay.log import EventLog, OutOfRange
from event_relay.schema import CODES, decode_event, expand, record_codes
from event_relay.sidecar_pb import disconnect_reason_pb2 as disconnect
from event_relay.sidecar_pb import registration_failure_reason_pb2 as registration
from event_relay.sidecar_pb.disconnect_reason_pb2 import Reason
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
from event_relay.sidecar_pb.registration_failure_reason_pb2 import RegistrationFailureReason

log = logging.getLogger("nautilus.event_relay")

BATCH = 1000  # events the cursor hands out per loop turn at most
READ_CHUNK = 65536  # bytes read (and discarded) from the sidecar at a time
# shackle's defaults, which Courier keeps (but the cap: shackle's is 120 s)
CONNECT_TIMEOUT = 0.5
RECONNECT_MIN = 0.5
RECONNECT_MAX = 30.0
CLOSE_TIMEOUT = 1.0  # stop(): how long a connection may take to flush before it is cut

TYPE_URL = "type.googleapis.com/eventssidecar.v1."
REFUSED_QOS = 128  # TopicInfo.qos of a refused filter (Courier's; MQTT 5 codes map to it)

# Our disconnect reasons are Courier's internal names -> enum Reason (any other: 0).
DISCONNECT_REASONS: dict[str, Reason] = {
    "not_authorized": disconnect.REASON_NOT_AUTHORIZED,
    "normal_disconnect": disconnect.REASON_NORMAL_DISCONNECT,
    "normal": disconnect.REASON_NORMAL_DISCONNECT,
    "session_taken_over": disconnect.REASON_SESSION_TAKEN_OVER,
    "administrative_action": disconnect.REASON_ADMINISTRATIVE_ACTION,
    "disconnect_keep_alive": disconnect.REASON_DISCONNECT_KEEP_ALIVE,
    "disconnect_migration": disconnect.REASON_DISCONNECT_MIGRATION,
    "bad_authentication_method": disconnect.REASON_BAD_AUTHENTICATION_METHOD,
    "remote_session_taken_over": disconnect.REASON_REMOTE_SESSION_TAKEN_OVER,
    "mqtt_client_disconnect": disconnect.REASON_MQTT_CLIENT_DISCONNECT,
    "receive_max_exceeded": disconnect.REASON_RECEIVE_MAX_EXCEEDED,
    "protocol_error": disconnect.REASON_PROTOCOL_ERROR,
    "publish_not_authorized_3_1_1": disconnect.REASON_PUBLISH_AUTH_ERROR,
    "invalid_pubrec_error": disconnect.REASON_INVALID_PUBREC_ERROR,
    "invalid_pubcomp_error": disconnect.REASON_INVALID_PUBCOMP_ERROR,
    "unexpected_frame_type": disconnect.REASON_UNEXPECTED_FRAME_TYPE,
    "exit_signal_received": disconnect.REASON_EXIT_SIGNAL_RECEIVED,
    "tcp_closed": disconnect.REASON_TCP_CLOSED,
}

# on_register_failed reasons -> enum RegistrationFailureReason (any other: 0).
REGISTRATION_FAILURE_REASONS: dict[str, RegistrationFailureReason] = {
    "no_matching_hook_found": registration.REGISTRATION_FAILURE_REASON_NO_MATCHING_HOOK_FOUND,
    "invalid_credentials": registration.REGISTRATION_FAILURE_REASON_INVALID_CREDENTIALS,
    "not_authorized": registration.REGISTRATION_FAILURE_REASON_NOT_AUTHORIZED,
    "ERR stale_request": registration.REGISTRATION_FAILURE_REASON_STALE_REQUEST,
    "invalid_signature": registration.REGISTRATION_FAILURE_REASON_INVALID_SIGNATURE,
    "username_rid_mismatch": registration.REGISTRATION_FAILURE_REASON_USERNAME_RID_MISMATCH,
}


# -- encoding: one event (named fields, event_relay.schema) -> one frame ----------------

Encoder = Callable[[dict[str, Any]], Message]


def _timestamp(event: dict[str, Any]) -> Timestamp:
    seconds, nanos = divmod(event["ts"], 1_000_000_000)
    return Timestamp(seconds=seconds, nanos=nanos)


def _on_register(e: dict[str, Any]) -> Message:
    return OnRegister(
        timestamp=_timestamp(e),
        peer_addr=e["peer_addr"],
        peer_port=e["peer_port"],
        username=e["username"],
        mountpoint=e["mountpoint"],
        client_id=e["client_id"],
        user_properties=dict(e["user_properties"] or ()),
        session_id=e["session_id"],
    )


def _on_register_failed(e: dict[str, Any]) -> Message:
    return OnRegisterFailed(
        timestamp=_timestamp(e),
        mountpoint=e["mountpoint"],
        client_id=e["client_id"],
        peer_addr=e["peer_addr"],
        peer_port=e["peer_port"],
        username=e["username"],
        clean_session=e["clean_start"],
        reason=REGISTRATION_FAILURE_REASONS.get(
            e["reason"], registration.REGISTRATION_FAILURE_REASON_UNSPECIFIED
        ),
    )


def _on_publish(e: dict[str, Any]) -> Message:
    return OnPublish(
        timestamp=_timestamp(e),
        username=e["username"],
        client_id=e["client_id"],
        mountpoint=e["mountpoint"],
        qos=e["qos"],
        topic=e["topic"],
        payload=e["payload"],
        retain=e["retain"],
        matched_acl=MatchedACL(name=e["acl_name"], pattern=e["acl_pattern"]),
        session_id=e["session_id"],
    )


def _on_subscribe(e: dict[str, Any]) -> Message:
    return OnSubscribe(
        timestamp=_timestamp(e),
        client_id=e["client_id"],
        mountpoint=e["mountpoint"],
        username=e["username"],
        topics=[
            TopicInfo(
                topic=topic,
                qos=min(qos, REFUSED_QOS),
                matched_acl=MatchedACL(name=acl_name, pattern=acl_pattern),
            )
            for topic, qos, acl_name, acl_pattern in e["topics"]
        ],
        session_id=e["session_id"],
    )


def _on_unsubscribe(e: dict[str, Any]) -> Message:
    return OnUnsubscribe(
        timestamp=_timestamp(e),
        username=e["username"],
        client_id=e["client_id"],
        mountpoint=e["mountpoint"],
        topics=e["topics"],
        session_id=e["session_id"],
    )


def _delivery(message: type[OnDeliver] | type[OnDeliveryComplete]) -> Encoder:
    """OnDeliver and OnDeliveryComplete have the same fields."""

    def encode(e: dict[str, Any]) -> Message:
        return message(
            timestamp=_timestamp(e),
            username=e["username"],
            client_id=e["client_id"],
            mountpoint=e["mountpoint"],
            topic=e["topic"],
            qos=e["qos"],
            is_retain=e["retain"],
            payload=e["payload"],
            matched_acl=MatchedACL(name=e["acl_name"]),
            persisted=e["persisted"],
            session_id=e["session_id"],
        )

    return encode


def _on_offline_message(e: dict[str, Any]) -> Message:
    return OnOfflineMessage(
        timestamp=_timestamp(e),
        client_id=e["client_id"],
        mountpoint=e["mountpoint"],
        qos=e["qos"],
        topic=e["topic"],
        payload=e["payload"],
        retain=e["retain"],
        session_id=e["session_id"],
    )


def _on_message_drop(e: dict[str, Any]) -> Message:
    return OnMessageDrop(
        timestamp=_timestamp(e),
        client_id=e["client_id"],
        mountpoint=e["mountpoint"],
        qos=e["qos"],
        topic=e["topic"],
        payload=e["payload"],
        reason=e["reason"],
        matched_acl=MatchedACL(name=e["acl_name"]),
        session_id=e["session_id"],
    )


def _session(message: type[OnClientWakeUp] | type[OnSessionExpired]) -> Encoder:
    """OnClientWakeUp and OnSessionExpired have the same fields."""

    def encode(e: dict[str, Any]) -> Message:
        return message(
            timestamp=_timestamp(e),
            client_id=e["client_id"],
            mountpoint=e["mountpoint"],
            session_id=e["session_id"],
        )

    return encode


def _disconnect(message: type[OnClientOffline] | type[OnClientGone]) -> Encoder:
    """OnClientOffline and OnClientGone have the same fields."""

    def encode(e: dict[str, Any]) -> Message:
        return message(
            timestamp=_timestamp(e),
            client_id=e["client_id"],
            mountpoint=e["mountpoint"],
            reason=DISCONNECT_REASONS.get(e["reason"], disconnect.REASON_UNSPECIFIED),
            username=e["username"],
            session_id=e["session_id"],
        )

    return encode


# hook name -> (its message's type_url, the encoder). None values (a username or session
# id that is not there, a payload the log did not keep) leave the field out: proto3 omits
# empty values anyway, which is what Courier sends for them.
_ENCODERS: dict[str, tuple[str, Encoder]] = {
    "on_register": (TYPE_URL + "OnRegister", _on_register),
    "on_register_failed": (TYPE_URL + "OnRegisterFailed", _on_register_failed),
    "on_publish": (TYPE_URL + "OnPublish", _on_publish),
    "on_subscribe": (TYPE_URL + "OnSubscribe", _on_subscribe),
    "on_unsubscribe": (TYPE_URL + "OnUnsubscribe", _on_unsubscribe),
    "on_deliver": (TYPE_URL + "OnDeliver", _delivery(OnDeliver)),
    "on_delivery_complete": (TYPE_URL + "OnDeliveryComplete", _delivery(OnDeliveryComplete)),
    "on_offline_message": (TYPE_URL + "OnOfflineMessage", _on_offline_message),
    "on_message_drop": (TYPE_URL + "OnMessageDrop", _on_message_drop),
    "on_client_wakeup": (TYPE_URL + "OnClientWakeUp", _session(OnClientWakeUp)),
    "on_client_offline": (TYPE_URL + "OnClientOffline", _disconnect(OnClientOffline)),
    "on_client_gone": (TYPE_URL + "OnClientGone", _disconnect(OnClientGone)),
    "on_session_expired": (TYPE_URL + "OnSessionExpired", _session(OnSessionExpired)),
}

_LENGTH = struct.Struct(">I")


def encode_frame(event: dict[str, Any]) -> bytes:
    """One event (`decode_event`'s dict) as Courier frames it: length, then the Any."""
    type_url, encode = _ENCODERS[event["type"]]
    envelope = AnyMessage(type_url=type_url, value=encode(event).SerializeToString())
    data = envelope.SerializeToString()
    return _LENGTH.pack(len(data)) + data


# -- the push ----------------------------------------------------------------------------


class SidecarPush:
    """Reads the relay log from where it was started and pushes each event of the
    configured hooks to the sidecar, over a pool of connections."""

    def __init__(self, config: SidecarConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self._codes = frozenset(CODES[hook] for hook in config.hooks)
        self._record_codes = record_codes(self._codes)
        self._pool = [_Connection(self, index) for index in range(config.pool_size)]
        self.position = log.next_seq  # the next event to take
        self._waiting_for: _Connection | None = None  # the connection the cursor waits for
        self._pump_due = False
        self._stopped = False
        self.sent = 0  # events written to a connection
        self.dropped = 0  # events the log let go of before they were taken, or not encodable
        self.errors = 0  # failed connects and connections that broke
        self.connected = 0  # connections up now

    @property
    def where(self) -> str:
        return f"{self.config.hostname}:{self.config.port}"

    def start(self) -> None:
        """Connect the pool and follow the log from its next event (new events only)."""
        self.position = self.log.next_seq
        self.log.listen(self._wake)
        for connection in self._pool:
            connection.task = asyncio.create_task(
                connection.run(), name=f"sidecar connection {connection.index}"
            )

    async def stop(self) -> None:
        """Close the pool; frames still in the backlogs are not sent."""
        self._stopped = True
        self.log.unlisten(self._wake)
        tasks = [c.task for c in self._pool if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the cursor

    def _wake(self) -> None:
        """Move the cursor on the next loop turn (once, however often it is woken)."""
        if not self._pump_due and not self._stopped:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump)

    def room(self, connection: _Connection) -> None:
        """`connection` came up or emptied its backlog: the cursor may go on if it was
        waiting for it."""
        if self._waiting_for is connection:
            self._waiting_for = None
            self._wake()

    def _pump(self) -> None:
        """Hand up to BATCH events to their connections' backlogs, in log order."""
        self._pump_due = False
        if self._stopped or self._waiting_for is not None:
            return
        try:
            raws, next_position = self.log.read(self.position, BATCH, self._record_codes)
        except OutOfRange as exc:
            lost = exc.first_seq - self.position
            assert lost > 0, exc  # the cursor never runs ahead of the log
            self.dropped += lost
            log.error(
                "event relay: sidecar %s: %d events (from %d) left the log before they "
                "could be sent; going on from %d",
                self.where,
                lost,
                self.position,
                exc.first_seq,
            )
            self.position = exc.first_seq
            self._wake()
            return
        pool = self._pool
        records = [msgpack.unpackb(raw) for raw in raws]
        # A record may begin before the position, and hold types not pushed.
        for values in expand(records, self.position, codes=self._codes):
            try:
                event = decode_event(values)
                connection = pool[zlib.crc32(event["client_id"].encode()) % len(pool)]
                if not connection.accepts():
                    self.position = event["seq"]
                    self._waiting_for = connection
                    return
                frame = encode_frame(event)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # A bug, not a state to wait out: stopping here would stop the push for good.
                self.dropped += 1
                log.error("event relay: sidecar %s: event not sent: %r", self.where, exc)
                continue
            connection.put(frame)
        self.position = next_position
        if next_position < self.log.next_seq:
            self._wake()


class _Connection:
    """One TCP connection of the pool, with its backlog, reconnected with shackle's
    backoff: the first retry after 500-750 ms, each later one after cur + U(0..cur/2),
    up to RECONNECT_MAX, from the start again once connected."""

    def __init__(self, push: SidecarPush, index: int) -> None:
        self.push = push
        self.index = index
        self.task: asyncio.Task[None] | None = None
        self.frames: deque[bytes] = deque()
        self.writing = 0  # frames taken from the backlog, written, not yet drained
        self.up = False
        self._wanted = asyncio.Event()  # frames arrived, or the sidecar closed
        self._down = False  # reported as down, not yet as up again

    def accepts(self) -> bool:
        return self.up and len(self.frames) + self.writing < self.push.config.backlog_size

    def put(self, frame: bytes) -> None:
        self.frames.append(frame)
        self._wanted.set()

    async def run(self) -> None:
        config = self.push.config
        delay = 0.0
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(config.hostname, config.port), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError) as exc:
                self._failed(f"cannot connect: {exc or 'timed out'}")
            else:
                delay = 0.0
                await self._serve(reader, writer)
            delay = min(RECONNECT_MAX, (delay or RECONNECT_MIN) * random.uniform(1.0, 1.5))
            await asyncio.sleep(delay)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Write the backlog until the connection breaks (or the task is cancelled)."""
        push = self.push
        self.up = True
        push.connected += 1
        if self._down:
            self._down = False
            log.info("event relay: sidecar %s: connection %d is up again", push.where, self.index)
        discard = asyncio.create_task(_discard(reader))
        discard.add_done_callback(self._closed)
        broken = True
        push.room(self)
        try:
            while not discard.done():
                if not self.frames:
                    self._wanted.clear()
                    await self._wanted.wait()
                    continue
                batch, self.frames = self.frames, deque()
                self.writing = len(batch)
                writer.writelines(batch)
                push.sent += len(batch)
                await writer.drain()
                self.writing = 0
                push.room(self)
            error = discard.exception()
            self._failed(f"closed by the sidecar: {error}" if error else "closed by the sidecar")
        except OSError as exc:
            self._failed(str(exc) or type(exc).__name__)
        except asyncio.CancelledError:
            broken = False
            raise
        finally:
            self.up = False
            self.writing = 0
            push.connected -= 1
            discard.cancel()
            if broken:
                writer.transport.abort()
            else:
                await _close(writer)

    def _closed(self, discard: asyncio.Task[None]) -> None:
        """The sidecar closed its side (or it broke): the writing loop ends."""
        if not discard.cancelled():
            discard.exception()  # seen here, reported by _serve
        self._wanted.set()

    def _failed(self, detail: str) -> None:
        self.push.errors += 1
        if not self._down:
            self._down = True
            log.warning(
                "event relay: sidecar %s: connection %d is down (%s); events wait in the "
                "log while it reconnects",
                self.push.where,
                self.index,
                detail,
            )


async def _discard(reader: asyncio.StreamReader) -> None:
    """Courier reads no answers: whatever the sidecar sends is thrown away."""
    while await reader.read(READ_CHUNK):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    """Let the connection flush what it was given, for CLOSE_TIMEOUT at most."""
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
    writer.transport.abort()
