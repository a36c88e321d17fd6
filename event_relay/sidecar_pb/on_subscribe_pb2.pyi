import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import matched_acl_pb2 as _matched_acl_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OnSubscribe(_message.Message):
    __slots__ = ("timestamp", "client_id", "mountpoint", "username", "topics", "session_id")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    timestamp: _timestamp_pb2.Timestamp
    client_id: str
    mountpoint: str
    username: str
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    session_id: str
    def __init__(self, timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., client_id: _Optional[str] = ..., mountpoint: _Optional[str] = ..., username: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ..., session_id: _Optional[str] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("topic", "qos", "matched_acl")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_ACL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    qos: int
    matched_acl: _matched_acl_pb2.MatchedACL
    def __init__(self, topic: _Optional[str] = ..., qos: _Optional[int] = ..., matched_acl: _Optional[_Union[_matched_acl_pb2.MatchedACL, _Mapping]] = ...) -> None: ...
