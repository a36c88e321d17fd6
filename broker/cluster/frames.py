"""The cluster channel's wire format, sans I/O: frames in, bytes out.

A frame is a 4-byte big-endian length, then a MessagePack array whose first item is the
frame's kind. A link starts with a handshake in which each node proves it holds the
cluster's secret without sending it: HELLO from the connecting node (with a fresh nonce),
CHALLENGE from the accepting node (with its own), PROOF from the connecting node, WELCOME
(with the accepting node's proof) to end it; either side may answer REFUSED instead, then
close. After that the connecting node sends the traffic (PUBLISH, ENQUEUE, TAKEOVER, PING)
and the accepting node answers on the same socket (ACK, PONG): one link per ordered pair
of nodes, as in VerneMQ. The whole format is in docs/clustering.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Any, NamedTuple

import msgpack

from broker.message import Message
from broker.protocol import Property

# 2: the secret is proved (CHALLENGE, PROOF), no longer sent in HELLO.
PROTOCOL_VERSION = 2

HELLO = 1  # [HELLO, version, node, boot id, nonce]
WELCOME = 2  # [WELCOME, node, boot id, proof]: the accepting node's proof
REFUSED = 3  # [REFUSED, reason]: from either side during the handshake, then the close
PUBLISH = 4  # [PUBLISH, message(, seq)]: match it against this node's subscriptions
# [ENQUEUE, ref, client id, [[message, qos, retain, subscription ids]], share(, seq)]
ENQUEUE = 5
ACK = 6  # [ACK, ref, error or None]
TAKEOVER = 7  # [TAKEOVER, ref, client id, clean]: release the session; queue follows
PING = 8  # [PING, n]
# [PONG, n]; [PONG, 0, at risk], sent of its own accord: with the messages the sender holds
# only in memory (broker/cluster/losses.py)
PONG = 9
LEAVING = 10  # [LEAVING]: the sender stops; send it nothing more until it is back
DRAINED = 11  # [DRAINED]: the answer, last on the answering node's own link
ANSWER = 12  # [ANSWER, ref, result]: a request's result (ACK says only done or not)
# The leaderless metadata's replication (broker/cluster/swc/service.py):
SWC_WRITE = 20  # [SWC_WRITE, group, key, object]: a write, broadcast
SWC_CLOCK = 21  # [SWC_CLOCK, ref, group] -> ANSWER [replica id, node clock]
SWC_FETCH = 22  # [SWC_FETCH, ref, group, dots] -> ANSWER [[key, dots, object]]
SWC_WATERMARK = 23  # [SWC_WATERMARK, ref, group] -> ANSWER watermark
SWC_KEYS = 24  # [SWC_KEYS, ref, group, start, limit] -> ANSWER [[[key, object]], last]
SWC_STANDING = 28  # [SWC_STANDING, ref] -> ANSWER [holds the metadata, fresh]: asked as a seed
# A node leaving the cluster for good (broker/cluster/departure.py):
LEAVE = 25  # [LEAVE, ref] -> ANSWER [error or None, what it says]: leave, with your sessions
TAKE = 26  # [TAKE, ref, client id, expiry] -> ACK: take this session (I am leaving)
LEFT = 27  # [LEFT, ref, remove] -> ACK: pull my replicas (then remove me, if remove)
# An operator's request run on every node (broker/admin.py: `nautilus admin session show`,
# `set`, ...):
ADMIN = 30  # [ADMIN, ref, command, arguments] -> ANSWER [error or None, result]
# Traces (broker/cluster/tracing.py): the node that reads a trace asks the others to trace
# its client too; their lines come back over their own links to it.
TRACE_START = 32  # [TRACE_START, trace id, client id, mountpoint, rate max, interval, trunc]
TRACE_STOP = 33  # [TRACE_STOP, trace id]: the sender's trace is over: stop your part
TRACE_LINE = 34  # [TRACE_LINE, trace id, line fields]: a line of the receiver's trace
TRACE_END = 35  # [TRACE_END, trace id, reason]: the sender's part ended (its rate limit)
TRACE_STOP_ALL = 36  # [TRACE_STOP_ALL]: end every trace you have
# The handshake's proof of the secret (between HELLO and WELCOME):
CHALLENGE = 40  # [CHALLENGE, node, nonce]: the accepting node's name and nonce
PROOF = 41  # [PROOF, proof]: the connecting node's proof
# At least once between nodes (broker/cluster/streams.py): a QoS 1/2 PUBLISH or single
# ENQUEUE carries `seq`, its number in the sender's stream to the receiver, which the
# sender keeps it under until the receiver says it is queued.
# [STREAM, epoch, settled]: first on every link: the numbering the seqs that follow use;
# wait for none up to `settled`
STREAM = 42
QUEUED = 43  # [QUEUED, epoch, seq]: the answer: every seq up to `seq` is queued (stored)

_LENGTH = struct.Struct(">I")
_PUBLISH_2 = b"\x92" + msgpack.packb(PUBLISH)  # an array of 2 items, the first PUBLISH
_PUBLISH_3 = b"\x93" + msgpack.packb(PUBLISH)


class FrameError(Exception):
    """A peer sent something that is not a frame of this protocol."""


def encode(*frame: Any) -> bytes:
    body = msgpack.packb(frame)
    return _LENGTH.pack(len(body)) + body


def publish_body(message: Message, now: float) -> bytes:
    """A PUBLISH frame's message, encoded once for every node it goes to (`publish_frame`
    puts each node's number after it)."""
    return msgpack.packb(pack_message(message, now))


def publish_frame(body: bytes, seq: int | None = None) -> bytes:
    """[PUBLISH, message] (QoS 0), or [PUBLISH, message, seq], around an encoded message."""
    frame = _PUBLISH_2 + body if seq is None else _PUBLISH_3 + body + msgpack.packb(seq)
    return _LENGTH.pack(len(frame)) + frame


def pack_message(message: Message, now: float) -> list[Any]:
    """A message as frames carry it (its expiry as the seconds it has left)."""
    left = None
    if message.expires_at is not None:
        left = max(0, int(message.expires_at - now))
    properties = message.properties
    if left is not None:
        properties = {**properties, Property.MESSAGE_EXPIRY_INTERVAL: left}
    return [
        message.topic,
        message.payload,
        message.qos,
        message.retain,
        properties,
        message.sender,
        message.acl_name,
    ]


def unpack_message(fields: list[Any], now: float) -> Message:
    topic, payload, qos, retain, properties, sender, acl_name = fields
    if Property.USER_PROPERTY in properties:
        properties[Property.USER_PROPERTY] = [tuple(p) for p in properties[Property.USER_PROPERTY]]
    message = Message(topic, payload, qos, retain, properties, sender, now=now)
    message.acl_name = acl_name
    return message


# -- the handshake ---------------------------------------------------------------------
#
# Each side proves it holds the secret with HMAC-SHA256(secret, what the handshake said so
# far, its role first). Both nonces are fresh per link, so a proof seen on the wire is
# worth nothing on another link; the role keeps one side's proof from passing as the
# other's, and the node names bind it to these two nodes.

NONCE_SIZE = 16  # bytes


class HandshakeError(ValueError):
    """A handshake frame that is not acceptable; the message is the REFUSED reason."""


class Hello(NamedTuple):
    """What the connecting node says of itself in HELLO."""

    node: str
    boot_id: str
    nonce: bytes


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def hello_of(frame: list[Any], own_node: str, own_boot_id: str = "") -> Hello:
    """The HELLO a link opened with (HandshakeError: the reason to refuse it). This node's
    own name is refused, but for this very process (its boot id): a seed list may name
    this node, and it says HELLO to itself to find out (swc/seeds.py)."""
    if frame[0] != HELLO or len(frame) != 5:
        raise HandshakeError("expected HELLO")
    _, version, node, boot_id, nonce = frame
    if version != PROTOCOL_VERSION:
        raise HandshakeError(f"protocol version {version} (this node speaks {PROTOCOL_VERSION})")
    itself = node == own_node and bool(own_boot_id) and boot_id == own_boot_id
    if not isinstance(node, str) or not node or (node == own_node and not itself):
        raise HandshakeError(f"bad node name {node!r}")
    if not isinstance(boot_id, str) or not nonce_ok(nonce):
        raise HandshakeError("a HELLO without a boot id and a nonce")
    return Hello(node, boot_id, nonce)


def nonce_ok(nonce: Any) -> bool:
    return isinstance(nonce, bytes) and len(nonce) == NONCE_SIZE


def connecting_proof(secret: str, hello: Hello, accepting_node: str, challenge: bytes) -> bytes:
    """The connecting node's proof (PROOF): over its HELLO, the name of the node it means
    to reach and that node's CHALLENGE nonce."""
    return _proof(secret, ["connecting", *hello, accepting_node, challenge])


def accepting_proof(
    secret: str, hello: Hello, accepting_node: str, boot_id: str, challenge: bytes
) -> bytes:
    """The accepting node's proof (WELCOME): the same, and its boot id."""
    return _proof(secret, ["accepting", *hello, accepting_node, challenge, boot_id])


def proved(expected: bytes, proof: Any) -> bool:
    """Whether a proof received is the one expected (in constant time)."""
    return isinstance(proof, bytes) and hmac.compare_digest(expected, proof)


def _proof(secret: str, fields: list[Any]) -> bytes:
    message = msgpack.packb([PROTOCOL_VERSION, *fields])
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


class Connecting:
    """The connecting node's side of a handshake (link.py's PeerLink, a seed contact):
    `hello` to send first, `proof` to answer the CHALLENGE, `welcomed` to check the
    WELCOME. HandshakeError, its message the reason to refuse, for what is not right."""

    def __init__(self, secret: str, node: str, boot_id: str, meant: str = "") -> None:
        self.secret = secret
        self.meant = meant  # the node this one means to reach ("": any, a seed)
        self.greeting = Hello(node, boot_id, new_nonce())
        self.peer = ""  # the accepting node, as its CHALLENGE names it
        self._nonce: bytes | None = None  # its CHALLENGE's

    def hello(self) -> bytes:
        return encode(HELLO, PROTOCOL_VERSION, *self.greeting)

    def proof(self, frame: list[Any]) -> bytes:
        """The PROOF answering a CHALLENGE, from the node meant."""
        if len(frame) != 3 or self._nonce is not None or not nonce_ok(frame[2]):
            raise HandshakeError("a CHALLENGE out of place")
        _, node, nonce = frame
        if not isinstance(node, str) or (self.meant and node != self.meant):
            raise HandshakeError(f"it is node {node}, not {self.meant}")
        self.peer, self._nonce = node, nonce
        return encode(PROOF, connecting_proof(self.secret, self.greeting, node, nonce))

    def welcomed(self, frame: list[Any]) -> str:
        """The accepting node's boot id, once WELCOME's proof is checked."""
        if len(frame) != 4 or self._nonce is None or frame[1] != self.peer:
            raise HandshakeError("a WELCOME out of place")
        _, node, boot_id, proof = frame
        expected = accepting_proof(self.secret, self.greeting, node, str(boot_id), self._nonce)
        if not proved(expected, proof):
            raise HandshakeError("wrong cluster secret (its proof does not match)")
        return str(boot_id)


class FrameDecoder:
    """Bytes in, frames (lists) out; FrameError for anything else.

    A length above `max_frame_size` is refused from the 4 bytes that say it, before any
    of the frame is kept: at most `max_frame_size` + 4 bytes wait here, plus what one
    feed brought. `limit` names the limit in that FrameError; `set_limit` changes both
    (the cluster listener takes only a small HELLO until it knows the peer, then
    `max_frame_size`: broker/cluster/link.py)."""

    def __init__(self, max_frame_size: int, limit: str = "max_frame_size") -> None:
        self.max_frame_size = max_frame_size
        self.limit = limit
        self._buffer = bytearray()

    def set_limit(self, max_frame_size: int, limit: str = "max_frame_size") -> None:
        self.max_frame_size = max_frame_size
        self.limit = limit

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame waiting for the rest."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[list[Any]]:
        buffer = self._buffer
        buffer += data
        frames = []
        offset = 0
        end = len(buffer)
        while end - offset >= 4:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > self.max_frame_size:
                raise FrameError(f"a frame of {length} bytes ({self.limit} {self.max_frame_size})")
            if end - offset - 4 < length:
                break
            body = bytes(buffer[offset + 4 : offset + 4 + length])
            offset += 4 + length
            try:
                frame = msgpack.unpackb(body, strict_map_key=False)
            except (ValueError, TypeError, msgpack.ExtraData) as exc:  # TypeError: a map
                # whose key is an array or a map (unhashable in Python)
                raise FrameError(f"not MessagePack: {exc}") from None
            if not isinstance(frame, list) or not frame or not isinstance(frame[0], int):
                raise FrameError("a frame must be an array starting with its kind")
            frames.append(frame)
        del buffer[:offset]
        return frames
