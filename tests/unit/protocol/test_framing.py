from __future__ import annotations

import struct

import pytest

from shoal.errors import ProtocolViolation
from shoal.protocol.framing import FrameDecoder, frame


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_frames_split_across_chunks_are_reassembled() -> None:
    d = FrameDecoder(1024)
    data = sized(b"hello") + sized(b"") + sized(b"world!")
    for i in range(len(data)):
        d.feed(data[i : i + 1])
    assert [d.next_frame(), d.next_frame(), d.next_frame(), d.next_frame()] == [b"hello", b"", b"world!", None]


def test_many_frames_in_one_chunk() -> None:
    d = FrameDecoder(1024)
    d.feed(b"".join(sized(bytes([i]) * i) for i in range(50)))
    got = []
    while (f := d.next_frame()) is not None:
        got.append(f)
    assert got == [bytes([i]) * i for i in range(50)]
    assert d.buffered == 0


def test_oversized_frame_is_refused_from_its_prefix_alone() -> None:
    d = FrameDecoder(100)
    d.feed(struct.pack(">i", 2**31 - 1))
    with pytest.raises(ProtocolViolation, match="socket.request.max.bytes"):
        d.next_frame()


def test_negative_size_is_refused() -> None:
    d = FrameDecoder(100)
    d.feed(struct.pack(">i", -5))
    with pytest.raises(ProtocolViolation):
        d.next_frame()


def test_eof_inside_a_frame_is_a_violation() -> None:
    d = FrameDecoder(100)
    d.feed(sized(b"abcdef")[:7])
    assert d.next_frame() is None
    d.feed(b"")
    with pytest.raises(ProtocolViolation, match="before the end"):
        d.next_frame()


def test_eof_between_frames_is_clean() -> None:
    d = FrameDecoder(100)
    d.feed(sized(b"x"))
    d.feed(b"")
    assert d.next_frame() == b"x"
    assert d.next_frame() is None


def test_frame_prefixes_the_total_size() -> None:
    assert b"".join(frame(b"ab", b"cde")) == sized(b"abcde")
