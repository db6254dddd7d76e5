"""Request and response headers, by hand for speed (every request pays for this).

Request header v1: api_key int16, api_version int16, correlation_id int32,
client_id nullable string (int16 length). v2 (flexible request versions) adds tagged
fields after client_id; client_id stays a non-compact string. Response header v0 is the
correlation id; v1 (flexible versions) adds an empty tagged-field section. ApiVersions
responses always use response header v0, so that a client can read the reply to any
ApiVersions version.

Pure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProtocolViolation

__all__ = ["RequestHeader", "parse_request_header", "read_uvarint", "response_header", "uvarint"]

_HDR = struct.Struct(">hhih")
_I32 = struct.Struct(">i")
API_VERSIONS_KEY = 18


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def uvarint(n: int) -> bytes:
    """``n`` (at least 0) as an unsigned varint: the lengths of compact strings and arrays."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Returns (value, new position). Raises ProtocolViolation past the end or over 5 bytes."""
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ProtocolViolation("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ProtocolViolation("varint longer than 5 bytes")


def parse_request_header(frame: bytes, flexible: bool | None) -> tuple[RequestHeader, int]:
    """Parse the header at the start of ``frame``.

    ``flexible`` says whether the request version uses header v2; None means "unknown
    API or version": only the fixed part is parsed (enough to answer with an error).
    Returns (header, offset of the body). Raises ProtocolViolation if truncated.
    """
    if len(frame) < 10:
        raise ProtocolViolation(f"request header needs 10 bytes, frame has {len(frame)}")
    api_key, api_version, correlation_id, client_len = _HDR.unpack_from(frame, 0)
    pos = 10
    client_id: str | None = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(frame):
            raise ProtocolViolation("client_id runs past the end of the frame")
        try:
            client_id = frame[pos:end].decode()
        except UnicodeDecodeError:
            raise ProtocolViolation("client_id is not UTF-8") from None
        pos = end
    elif client_len != -1:
        raise ProtocolViolation(f"invalid client_id length {client_len}")
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    """The position after the tagged-field section at ``pos`` (flexible versions).
    Raises ProtocolViolation when it runs past the end."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise ProtocolViolation("tagged field runs past the end of the frame")
    return pos


def response_header(api_key: int, correlation_id: int, flexible: bool) -> bytes:
    """Header bytes for a response (v1 = with empty tagged fields, except ApiVersions)."""
    if flexible and api_key != API_VERSIONS_KEY:
        return _I32.pack(correlation_id) + b"\x00"
    return _I32.pack(correlation_id)
