import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import matched_acl_pb2 as _matched_acl_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OnMessageDrop(_message.Message):
    __slots__ = ("timestamp", "client_id", "mountpoint", "qos", "topic", "payload", "reason", "matched_acl", "session_id")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_ACL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    timestamp: _timestamp_pb2.Timestamp
    client_id: str
    mountpoint: str
    qos: int
    topic: str
    payload: bytes
    reason: str
    matched_acl: _matched_acl_pb2.MatchedACL
    session_id: str
    def __init__(self, timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., client_id: _Optional[str] = ..., mountpoint: _Optional[str] = ..., qos: _Optional[int] = ..., topic: _Optional[str] = ..., payload: _Optional[bytes] = ..., reason: _Optional[str] = ..., matched_acl: _Optional[_Union[_matched_acl_pb2.MatchedACL, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...
