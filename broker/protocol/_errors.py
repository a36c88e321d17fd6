# Errors raised by the codec. Each carries `reason_code`: the MQTT 5 code the broker sends
# in CONNACK or DISCONNECT before closing (for 3.x clients it only closes).
#
# RemoteProtocolError: the peer broke the protocol. LocalProtocolError: we asked the codec
# to encode something the protocol does not allow (a bug on our side, or a bad argument).
from __future__ import annotations

from ._reasons import ReasonCode


class ProtocolError(Exception):
    """Base class: something in the byte stream or a packet breaks the MQTT rules."""

    reason_code: int = ReasonCode.MALFORMED_PACKET

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol. Default reason 0x81 (malformed)."""


class LocalProtocolError(ProtocolError):
    """We were asked to encode a packet the protocol does not allow."""

    reason_code = ReasonCode.PROTOCOL_ERROR


def malformed(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, ReasonCode.MALFORMED_PACKET)


def protocol_error(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, ReasonCode.PROTOCOL_ERROR)
