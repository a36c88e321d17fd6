# The incremental decoder: bytes in, in any chunking; packets out.
#
# Theory of operation: `receive_data` appends to one buffer; `next_packet` reads the fixed
# header, checks the remaining length against `max_packet_size` before waiting for the body
# (so an oversized packet is refused without buffering it), slices the body out once and
# hands it to the reader for its type. Which packet types may arrive, and when, is the
# table in _state.py. After an error the decoder is broken for good: a stream that lost
# framing cannot be trusted again.
#
# The hot path: once the protocol level is known, runs of the packets a flood is made of
# (PUBLISH, short acknowledgements, PINGREQ/PINGRESP) are decoded at once by the compiled
# `_speedups.decode_run`, which builds the same packets as the readers here and stops at
# anything else; that packet is read here, so every error is raised by this module.
# Without the compiled module (no C compiler at install, or `use_compiled(False)`: see
# _compiled.py) this module does it all; the tests run both.
from __future__ import annotations

import functools
from typing import Literal

from ._compiled import hot
from ._errors import ProtocolError, RemoteProtocolError, malformed, protocol_error
from ._events import Connect, Packet, PubAck, Publish
from ._readers import READERS, REQUIRED_FLAGS, read_publish
from ._reasons import ReasonCode
from ._state import allowed_types

PUBLISH = 3
MAX_PACKET_SIZE = 268_435_460  # 1 + 4 byte varint + the largest remaining length
RUN = 64  # packets decoded per call of the compiled decoder
_NO_PACKETS: list[Packet] = []


@functools.cache  # one int per table, shared by every decoder rather than made by each
def _mask(types: frozenset[int]) -> int:
    mask = 0
    for packet_type in types:
        mask |= 1 << packet_type
    return mask


class Decoder:
    """Decodes the packets of one connection.

    Args:
        role: "server" decodes what clients send; "client" what servers send.
        protocol_level: 3, 4 or 5; for a server it is set by the CONNECT packet.
        max_packet_size: the largest whole packet accepted (0x95 beyond it).
    """

    __slots__ = (
        "_allowed",
        "_allowed_mask",
        "_buffer",
        "_error",
        "_pos",
        "_ready",
        "max_packet_size",
        "protocol_level",
        "role",
    )

    def __init__(
        self,
        role: Literal["server", "client"] = "server",
        protocol_level: int | None = None,
        max_packet_size: int = MAX_PACKET_SIZE,
    ) -> None:
        if role == "client" and protocol_level is None:
            raise ValueError("a client decoder needs the protocol level it connected with")
        self.role = role
        self.protocol_level = protocol_level
        self.max_packet_size = max_packet_size
        self._buffer = bytearray()
        self._pos = 0
        self._error: ProtocolError | None = None
        self._allowed = allowed_types(role, protocol_level)
        self._allowed_mask = _mask(self._allowed)
        # Decoded by the compiled run, last one first; empty: the shared _NO_PACKETS (never
        # appended to: a run's list replaces it), so an idle connection holds no list.
        self._ready = _NO_PACKETS

    def receive_data(self, data: bytes) -> None:
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    def next_packet(self) -> Packet | None:
        """The next complete packet, or None until more bytes arrive.

        Raises:
            RemoteProtocolError: the bytes break the protocol; its reason_code says how.
        """
        ready = self._ready
        if ready:
            return ready.pop()
        if self._error is not None:
            raise self._error
        try:
            return self._decode()
        except ProtocolError as exc:
            self._error = exc
            raise

    def pending(self) -> bytes:
        """The bytes received and not decoded yet: the start of the packets still
        arriving (a trace starting mid-stream decodes from there)."""
        return bytes(self._buffer[self._pos :])

    def take_like(self, first: Publish, max_bytes: int) -> list[Publish]:
        """The PUBLISHes complete right after `first` that are like it: QoS 0, the same
        topic and retain flag, no properties; taken out of the decoder, in order, up to
        `max_bytes` of packets with `first`. (The broker routes such a run at once.) An
        error in the packet after them is raised by the next `next_packet`."""
        run: list[Publish] = []
        topic = first.topic
        retain = first.retain
        size = len(first.raw) if first.raw is not None else max_bytes
        while size < max_bytes:
            packet = self._peek()
            if (
                type(packet) is not Publish
                or packet.qos
                or packet.topic != topic
                or packet.retain != retain
                or packet.properties
                or packet.raw is None
            ):
                break
            size += len(packet.raw)
            if size > max_bytes:
                break
            run.append(packet)
            self._ready.pop()
        return run

    def take_acks(self, limit: int) -> list[int]:
        """The packet ids of the PUBACKs complete next, up to `limit`, taken out of the
        decoder (a subscriber's acknowledgements are handled at once)."""
        ids: list[int] = []
        while len(ids) < limit:
            packet = self._peek()
            if type(packet) is not PubAck:
                break
            ids.append(packet.packet_id)
            self._ready.pop()
        return ids

    def _peek(self) -> Packet | None:
        """The next complete packet, left in place; None when there is none yet, or when
        it is an error, which the next `next_packet` raises."""
        ready = self._ready
        if ready:
            return ready[-1]
        if self._error is not None:
            return None
        try:
            packet = self._decode()
        except ProtocolError as exc:
            self._error = exc
            return None
        if packet is None:
            return None
        ready = self._ready
        if ready is _NO_PACKETS:
            ready = self._ready = []
        ready.append(packet)
        return packet

    def give_back(self, packets: list[Publish]) -> None:
        """Packets taken by `take_like` and not handled: `next_packet` gives them again,
        in order, before anything else."""
        if packets:
            ready = self._ready
            if ready is _NO_PACKETS:
                ready = self._ready = []
            ready.extend(reversed(packets))

    def _decode(self) -> Packet | None:
        level = self.protocol_level
        decode_run = hot.decode_run
        if decode_run is not None and level is not None:
            ready, self._pos = decode_run(
                self._buffer, self._pos, level, self._allowed_mask, self.max_packet_size, RUN
            )
            if ready:
                self._ready = ready
                return ready.pop()
        return self._next_packet()

    def _next_packet(self) -> Packet | None:
        buf = self._buffer
        pos = self._pos
        end = len(buf)
        if end - pos < 1:
            return None
        first = buf[pos]
        packet_type = first >> 4
        if packet_type not in self._allowed:  # judged on the first byte: garbage fails fast
            raise self._unexpected(packet_type)
        # Remaining length: a variable byte integer of at most four bytes [MQTT-1.5.5].
        length = 0
        shift = 0
        i = pos + 1
        while True:
            if i >= end:
                return None
            byte = buf[i]
            length |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                break
            shift += 7
            if shift == 28:
                raise malformed("remaining length longer than four bytes")
        if i - pos + length > self.max_packet_size:
            raise RemoteProtocolError(
                f"packet of {i - pos + length} bytes exceeds the maximum of {self.max_packet_size}",
                ReasonCode.PACKET_TOO_LARGE,
            )
        if end - i < length:
            return None
        self._pos = i + length
        flags = first & 0x0F
        required = REQUIRED_FLAGS.get(packet_type)
        if required is not None and flags != required:
            raise malformed(f"invalid fixed header flags {flags:#x} [MQTT-2.1.3-1]")
        # No level only before CONNECT, the one packet allowed then, which carries its own.
        level = self.protocol_level or 0
        if packet_type == PUBLISH:  # the hot path: one copy, which the packet keeps as raw
            return read_publish(flags, bytes(buf[pos : i + length]), level, i - pos)
        packet = READERS[packet_type](flags, bytes(buf[i : i + length]), level)
        if type(packet) is Connect:
            self.protocol_level = packet.protocol_level
            self._allowed = allowed_types(self.role, self.protocol_level)
            self._allowed_mask = _mask(self._allowed)
        return packet

    def _unexpected(self, packet_type: int) -> RemoteProtocolError:
        if packet_type == 0:
            return malformed("packet type 0 is reserved")
        if self.protocol_level is None:
            return protocol_error(f"packet type {packet_type} before CONNECT [MQTT-3.1.0-1]")
        if packet_type == 1:
            return protocol_error("second CONNECT on one connection [MQTT-3.1.0-2]")
        return protocol_error(f"packet type {packet_type} is not sent to a {self.role}")
