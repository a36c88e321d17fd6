import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import registration_failure_reason_pb2 as _registration_failure_reason_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OnRegisterFailed(_message.Message):
    __slots__ = ("timestamp", "mountpoint", "client_id", "peer_addr", "peer_port", "username", "clean_session", "reason")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    CLEAN_SESSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    timestamp: _timestamp_pb2.Timestamp
    mountpoint: str
    client_id: str
    peer_addr: str
    peer_port: int
    username: str
    clean_session: bool
    reason: _registration_failure_reason_pb2.RegistrationFailureReason
    def __init__(self, timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mountpoint: _Optional[str] = ..., client_id: _Optional[str] = ..., peer_addr: _Optional[str] = ..., peer_port: _Optional[int] = ..., username: _Optional[str] = ..., clean_session: _Optional[bool] = ..., reason: _Optional[_Union[_registration_failure_reason_pb2.RegistrationFailureReason, str]] = ...) -> None: ...
