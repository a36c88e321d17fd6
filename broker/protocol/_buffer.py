# Primitive data types of MQTT (section 1.5): integers, variable byte integers, UTF-8
# strings and binary data, read from an immutable `bytes` body with an explicit position.
#
# Readers take (data, pos) and return (value, new_pos). They raise RemoteProtocolError with
# 0x81 (malformed) on truncation or bad encodings, never IndexError or UnicodeDecodeError.
from __future__ import annotations

from ._errors import malformed

MAX_VARINT = 268_435_455  # the largest value four bytes can hold [MQTT-1.5.5]


def encode_varint(value: int) -> bytes:
    if value < 128:
        return bytes((value,))
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        digit = value & 0x7F
        value >>= 7
        if value:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    if len(data) - pos >= 4:
        raise malformed("variable byte integer longer than four bytes")
    raise malformed("truncated variable byte integer")


def read_byte(data: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(data):
        raise malformed("truncated packet: expected a byte")
    return data[pos], pos + 1


def read_u16(data: bytes, pos: int) -> tuple[int, int]:
    end = pos + 2
    if end > len(data):
        raise malformed("truncated packet: expected a two byte integer")
    return (data[pos] << 8) | data[pos + 1], end


def read_u32(data: bytes, pos: int) -> tuple[int, int]:
    end = pos + 4
    if end > len(data):
        raise malformed("truncated packet: expected a four byte integer")
    return int.from_bytes(data[pos:end], "big"), end


def read_binary(data: bytes, pos: int) -> tuple[bytes, int]:
    length, pos = read_u16(data, pos)
    end = pos + length
    if end > len(data):
        raise malformed("truncated packet: binary data runs past the end")
    return data[pos:end], end


def read_string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = read_binary(data, pos)
    return decode_utf8(raw), pos


def decode_utf8(raw: bytes) -> str:
    """UTF-8 as MQTT requires it: well formed, no surrogates, no U+0000 [MQTT-1.5.4-1/2]."""
    try:
        text = raw.decode("utf-8")  # Python's codec already rejects encoded surrogates
    except UnicodeDecodeError:
        raise malformed("string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise malformed("string contains U+0000")
    return text


def encode_u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def encode_binary(value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + value


def encode_string(value: str) -> bytes:
    if "\x00" in value:
        raise ValueError("string contains U+0000 [MQTT-1.5.4-2]")
    return encode_binary(value.encode("utf-8"))
