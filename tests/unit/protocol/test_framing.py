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


# -- memory gating (the broker's side) ------------------------------------------------------


def test_gated_decoder_waits_for_a_grant_before_taking_the_body() -> None:
    d = FrameDecoder(1 << 20, gated=True)
    d.feed(sized(b"abc") + sized(b"de"))
    assert d.next_frame() is None
    assert d.memory_wanted == 3
    assert d.next_frame() is None  # still waiting: nothing is handed out
    d.grant()
    assert d.memory_wanted is None
    assert d.next_frame() == b"abc"
    assert d.next_frame() is None and d.memory_wanted == 2
    d.grant()
    assert d.next_frame() == b"de"
    assert d.next_frame() is None and d.memory_wanted is None


def test_gated_empty_frame_still_asks_for_zero_bytes() -> None:
    d = FrameDecoder(100, gated=True)
    d.feed(sized(b""))
    assert d.next_frame() is None and d.memory_wanted == 0
    d.grant()
    assert d.next_frame() == b""


def test_grant_without_a_waiting_frame_is_an_error() -> None:
    d = FrameDecoder(100, gated=True)
    with pytest.raises(RuntimeError):
        d.grant()


def test_large_body_is_buffered_as_it_arrives_not_allocated_from_its_size() -> None:
    size = 10 * 1024 * 1024
    d = FrameDecoder(size, gated=True)
    d.feed(struct.pack(">i", size))
    assert d.next_frame() is None and d.memory_wanted == size
    d.grant()
    chunk = b"x" * 65536
    fed = 0
    for _ in range(20):
        d.feed(chunk)
        fed += len(chunk)
        assert d.next_frame() is None
    # what is held is what arrived, not the announced size
    assert d.buffered == fed
    rest = size - fed
    d.feed(b"y" * rest + sized(b"next"))
    body = d.next_frame()
    assert body is not None and len(body) == size and body.endswith(b"y") and body.startswith(b"x")
    assert d.next_frame() is None and d.memory_wanted == 4
    d.grant()
    assert d.next_frame() == b"next"


def test_chunks_inside_a_granted_body_are_kept_without_copying() -> None:
    d = FrameDecoder(1000, gated=True)
    d.feed(struct.pack(">i", 300) + b"a" * 10)
    assert d.next_frame() is None
    d.grant()
    assert d.next_frame() is None  # the 10 bytes move into the body
    chunk = b"b" * 100
    d.feed(chunk)
    assert d._parts[-1] is chunk  # noqa: SLF001 - the received object itself
    d.feed(b"c" * 190 + b"\x00\x00")
    body = d.next_frame()
    assert body == b"a" * 10 + b"b" * 100 + b"c" * 190
    assert d.buffered == 2


def test_eof_while_waiting_for_memory_is_a_truncated_frame() -> None:
    d = FrameDecoder(100, gated=True)
    d.feed(sized(b"abc")[:5])
    assert d.next_frame() is None and d.memory_wanted == 3
    d.feed(b"")
    with pytest.raises(ProtocolViolation, match="before the end"):
        d.next_frame()


def test_byte_by_byte_with_grants_reassembles_every_frame() -> None:
    frames = [bytes([i]) * (i * 7) for i in range(30)]
    data = b"".join(sized(f) for f in frames)
    d = FrameDecoder(1000, gated=True)
    got = []
    for i in range(len(data)):
        d.feed(data[i : i + 1])
        while True:
            f = d.next_frame()
            if f is not None:
                got.append(f)
                continue
            if d.memory_wanted is not None:
                d.grant()
                continue
            break
    assert got == frames
