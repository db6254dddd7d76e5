"""Request and response bodies, through kio's generated entities and native reader.

For each (api_key, version) the kio classes, reader and writer are looked up once and
cached. ``decode_request`` turns a frame into (header, entity); ``encode_response``
turns an entity, or a response view of ``shoal.protocol.messages``, into the frame pieces
to write. Pure.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any, NamedTuple

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from ..errors import ProtocolViolation
from .bounds import UnknownTaggedFields, request_checker
from .framing import frame
from .header import RequestHeader, parse_request_header, response_header
from .views import fill_absent, to_entity

__all__ = ["Codec", "EncodedBody", "EncodedPieces", "codec_for", "decode_body", "decode_request", "encode_body", "encode_response"]


class Codec(NamedTuple):
    request_type: type
    response_type: type
    read_request: Any
    write_response: Any
    flexible: bool
    check_request: Any
    """Checks a request body's length fields against the frame before ``read_request`` (bounds.py)."""


class EncodedPieces(NamedTuple):
    """A response body already encoded for the request's API version, as pieces for the
    connection (bytes-like, or a log's FileSlice: see ``_Pieces``)."""

    pieces: list[Any]


class EncodedBody(NamedTuple):
    """A response body already encoded for the request's API version.

    A handler may return one instead of an entity when it caches encoded responses
    (full Metadata); ``encode_response`` only adds the header and the size prefix.
    """

    body: bytes


@cache
def codec_for(api_key: int, version: int) -> Codec | None:
    """kio's classes for this API version, or None if kio does not have it."""
    try:
        req = load_request_schema(api_key, version)
        resp = load_response_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None
    fill_absent(req)
    return Codec(req, resp, entity_reader(req), entity_writer(resp), bool(req.__flexible__), request_checker(req))


def decode_request(frame_bytes: bytes, codec: Codec) -> tuple[RequestHeader, Any]:
    """Parse header and body. Raises ProtocolViolation if either does not decode.

    The body's length fields are checked against the frame first: kio's native reader
    reserves what an array announces, and a failed allocation there aborts the process.
    Tagged fields the version's schema does not know are left out (see ``bounds``).
    """
    header, pos = parse_request_header(frame_bytes, codec.flexible)
    try:
        codec.check_request(frame_bytes, pos)
    except UnknownTaggedFields as e:  # skipped, as Kafka's readers skip them
        frame_bytes = e.frame
    try:
        body, _size = codec.read_request(frame_bytes, pos)
    except Exception as e:  # kio raises several types for bad input
        raise ProtocolViolation(
            f"cannot decode {codec.request_type.__name__} v{header.api_version}: {e}"
        ) from e
    return header, body


def encode_body(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def decode_body(entity_type: type, data: bytes) -> Any:
    value: Any
    value, _ = entity_reader(entity_type)(data, 0)
    return value


LARGE_VALUE = 16 * 1024
"""Byte values at least this large (record batches) go into a response's pieces as they are."""


class _Pieces:
    """A write-only buffer for kio's writers that keeps large ``bytes`` values as pieces of
    their own instead of copying them (a Fetch response's records: a follower's or a
    consumer's megabyte is written to the socket from the bytes the log read).  A value
    that is not bytes-like (a log's file slice, which the connection reads only when it
    sends it) is always a piece of its own."""

    __slots__ = ("_small", "pieces")

    def __init__(self) -> None:
        self.pieces: list[Any] = []
        self._small = bytearray()

    def write(self, value: Any) -> int:
        n = len(value)
        t = type(value)
        if (n >= LARGE_VALUE and t is bytes) or (t is not bytes and t is not bytearray and t is not memoryview):
            if self._small:
                self.pieces.append(bytes(self._small))
                self._small.clear()
            self.pieces.append(value)
        else:
            self._small += value
        return n

    def done(self) -> list[bytes]:
        if self._small:
            self.pieces.append(bytes(self._small))
            self._small.clear()
        return self.pieces


def encode_response(codec: Codec, api_key: int, correlation_id: int, entity: Any) -> list[bytes]:
    if type(entity) is EncodedBody:
        return frame(response_header(api_key, correlation_id, codec.flexible), entity.body)
    if type(entity) is EncodedPieces:
        return frame(response_header(api_key, correlation_id, codec.flexible), *entity.pieces)
    if type(entity) is not codec.response_type:
        entity = to_entity(entity, codec.response_type)
    buf = _Pieces()
    codec.write_response(buf, entity)
    return frame(response_header(api_key, correlation_id, codec.flexible), *buf.done())
