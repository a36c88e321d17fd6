from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class MatchedACL(_message.Message):
    __slots__ = ("name", "pattern")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    name: str
    pattern: str
    def __init__(self, name: _Optional[str] = ..., pattern: _Optional[str] = ...) -> None: ...
