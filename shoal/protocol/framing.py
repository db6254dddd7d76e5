"""Kafka's framing: every request and response is an int32 size followed by that many bytes.

Theory of operation
-------------------
``FrameDecoder`` is fed whatever the socket delivered (``feed``) and hands out complete
frames (``next_frame``), h11 style: the caller owns the socket. A frame whose announced
size is negative or larger than ``max_frame_bytes`` (``socket.request.max.bytes``) is a
:class:`ProtocolViolation` as soon as its 4-byte prefix arrives, before any of its body
is buffered, so a peer cannot make the broker allocate what it announces. Bytes left
after EOF (``feed(b"")``) form a truncated frame, also a violation.

Buffering is O(n): received chunks are appended to one bytearray and consumed frames are
cut from its front only when the consumed part exceeds half the buffer.

Pure: no sockets, no asyncio.
"""

from __future__ import annotations

import struct

from ..errors import ProtocolViolation

__all__ = ["FrameDecoder", "frame"]

_SIZE = struct.Struct(">i")


class FrameDecoder:
    __slots__ = ("_buf", "_pos", "_max", "_eof")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max = max_frame_bytes
        self._eof = False

    def feed(self, data: bytes) -> None:
        """Add received bytes; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, or None when more data is needed.

        Raises ProtocolViolation for an impossible size or a frame cut by EOF.
        """
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 4:
            if self._eof and avail:
                raise ProtocolViolation("connection closed inside a frame's size prefix")
            return None
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < 0 or size > self._max:
            raise ProtocolViolation(
                f"frame of {size} bytes is outside 0..{self._max} (socket.request.max.bytes)"
            )
        end = pos + 4 + size
        if len(buf) < end:
            if self._eof:
                raise ProtocolViolation(f"connection closed {end - len(buf)} bytes before the end of a frame")
            return None
        body = bytes(buf[pos + 4 : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > (len(buf) >> 1):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return body


def frame(*parts: bytes) -> list[bytes]:
    """Size-prefix the concatenation of ``parts``; returns the pieces for ``writelines``."""
    size = 0
    for p in parts:
        size += len(p)
    return [_SIZE.pack(size), *parts]
