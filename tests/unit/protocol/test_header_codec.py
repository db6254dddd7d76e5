from __future__ import annotations

import io
import struct

import pytest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.serial import entity_writer

from shoal.errors import ProtocolViolation
from shoal.protocol.codec import codec_for, decode_request, encode_response
from shoal.protocol.entities import make, sub
from shoal.protocol.header import parse_request_header, response_header


def request_frame(api_key: int, version: int, correlation_id: int, client_id: str | None, body: bytes,
                  flexible: bool, tags: bytes = b"\x00") -> bytes:
    cid = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    return struct.pack(">hhi", api_key, version, correlation_id) + cid + (tags if flexible else b"") + body


def test_header_v2_with_tagged_fields_is_skipped() -> None:
    tags = b"\x02" + b"\x00\x03abc" + b"\x05\x01z"  # two tagged fields
    data = request_frame(3, 12, 77, "me", b"BODY", True, tags)
    header, pos = parse_request_header(data, True)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, 12, 77, "me")
    assert data[pos:] == b"BODY"


def test_null_client_id_and_v1_header() -> None:
    data = request_frame(0, 3, 5, None, b"B", False)
    header, pos = parse_request_header(data, False)
    assert header.client_id is None and data[pos:] == b"B"


@pytest.mark.parametrize("data", [b"", b"\x00\x03\x00\x0c", request_frame(3, 12, 1, "abc", b"", True)[:11]])
def test_truncated_headers_are_violations(data: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(data, True)


def test_decode_a_real_kio_request_and_reject_garbage() -> None:
    codec = codec_for(3, 12)
    assert codec is not None and codec.flexible
    buf = io.BytesIO()
    entity_writer(MetadataRequest)(buf, MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="t"),),  # type: ignore[arg-type]
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    header, body = decode_request(request_frame(3, 12, 9, "c", buf.getvalue(), True), codec)
    assert header.correlation_id == 9 and body.topics[0].name == "t"
    with pytest.raises(ProtocolViolation):
        decode_request(request_frame(3, 12, 9, "c", b"\xff\xff\xff\xff\xff\xff", True), codec)


def test_response_header_versions() -> None:
    assert response_header(3, 7, True) == b"\x00\x00\x00\x07\x00"
    assert response_header(3, 7, False) == b"\x00\x00\x00\x07"
    assert response_header(18, 7, True) == b"\x00\x00\x00\x07"  # ApiVersions: always v0


def test_codec_for_unknown_versions_is_none() -> None:
    assert codec_for(3, 99) is None
    assert codec_for(9999, 0) is None


def test_make_fills_zero_values_and_drops_unknown_fields() -> None:
    codec = codec_for(18, 3)
    assert codec is not None
    cls = codec.response_type
    resp = make(cls, api_keys=(make(sub(cls, "ApiVersion"), api_key=0, min_version=3, max_version=11),),
                not_a_field=1)
    pieces = encode_response(codec, 18, 42, resp)
    data = b"".join(pieces)
    size, corr = struct.unpack_from(">ii", data)
    assert size == len(data) - 4 and corr == 42
    # error_code 0, one api key (compact array length 2), throttle 0, no tagged fields
    assert data[8:10] == b"\x00\x00" and data[10] == 2 and data.endswith(b"\x00\x00\x00\x00\x00")
