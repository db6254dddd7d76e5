"""Kafka's framing: every request and response is an int32 size followed by that many bytes.

Theory of operation
-------------------
``FrameDecoder`` is fed whatever the socket delivered (``feed``) and hands out complete
frames (``next_frame``), h11 style: the caller owns the socket. A frame whose announced
size is negative or larger than ``max_frame_bytes`` (``socket.request.max.bytes``) is a
:class:`ProtocolViolation` as soon as its 4-byte prefix arrives, before any of its body
is buffered, so a peer cannot make the broker allocate what it announces. Bytes left
after EOF (``feed(b"")``) form a truncated frame, also a violation.

Memory gating (``gated=True``, the broker's side): once a frame's size prefix is read,
``next_frame`` returns None and ``memory_wanted`` says how many bytes the body needs
until the caller calls ``grant()`` (having reserved that much of its memory pool).
Until then the body's bytes are not taken out of the unread buffer; the caller is
expected to stop reading meanwhile, so that buffer holds at most one read. Without
gating every frame is granted at once.

Nothing is allocated from the announced size: a granted body is buffered as the chunks
that arrived (the received ``bytes`` objects themselves when a chunk lies inside the
body), and joined once when complete. So a peer that announces 100 MiB and sends 95 MiB
holds 95 MiB, not more. Unread bytes are kept in one bytearray, and consumed frames are
cut from its front only when the consumed part exceeds half of it (O(n) overall).

Pure: no sockets, no asyncio.
"""

from __future__ import annotations

import struct

from ..errors import ProtocolViolation

__all__ = ["FrameDecoder", "frame"]

_SIZE = struct.Struct(">i")


class FrameDecoder:
    __slots__ = ("_buf", "_eof", "_gated", "_granted", "_have", "_max", "_parts", "_pos", "_size")

    def __init__(self, max_frame_bytes: int, *, gated: bool = False) -> None:
        self._buf = bytearray()
        """Received bytes not yet part of a granted body: prefixes, and what follows them."""
        self._pos = 0
        """Start of the unread part of ``_buf``."""
        self._max = max_frame_bytes
        self._eof = False
        self._gated = gated
        self._size = -1
        """Body size of the frame whose prefix was read; -1 between frames."""
        self._granted = False
        """Whether memory for the current body was granted (always, when not gated)."""
        self._parts: list[bytes] = []
        """Body bytes of the current frame taken out of the stream so far (granted only)."""
        self._have = 0
        """Sum of the lengths of ``_parts``."""

    def feed(self, data: bytes) -> None:
        """Add received bytes; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._granted and self._pos == len(self._buf):
            # Inside a granted body with nothing unread before it: keep the chunk itself.
            need = self._size - self._have
            if len(data) <= need:
                self._parts.append(data)
                self._have += len(data)
                return
            self._parts.append(data[:need])
            self._have += need
            data = data[need:]
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes held: unread ones and the current body's."""
        return len(self._buf) - self._pos + self._have

    @property
    def memory_wanted(self) -> int | None:
        """The size of the body waiting for ``grant()``, or None."""
        if self._size >= 0 and not self._granted:
            return self._size
        return None

    def grant(self) -> None:
        """Memory for the current body (``memory_wanted`` bytes) was reserved by the caller."""
        if self._size < 0 or self._granted:
            raise RuntimeError("no frame is waiting for memory")
        self._granted = True

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, or None when more data (or a grant) is needed.

        Raises ProtocolViolation for an impossible size or a frame cut by EOF.
        """
        if self._size < 0:
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
            self._consume(4)
            self._size = size
            self._granted = not self._gated
        if not self._granted:
            if self._eof:
                raise ProtocolViolation(f"connection closed before the end of a frame of {self._size} bytes")
            return None
        need = self._size - self._have
        avail = len(self._buf) - self._pos
        if avail >= need:
            if self._have == 0:
                body = self._take(need)
            else:
                self._parts.append(self._take(need))
                body = b"".join(self._parts)
            self._size = -1
            self._granted = False
            self._parts = []
            self._have = 0
            return body
        if avail:
            # Move what arrived into the body's parts, so that later chunks are kept as they come.
            self._parts.append(self._take(avail))
            self._have += avail
        if self._eof:
            raise ProtocolViolation(f"connection closed {self._size - self._have} bytes before the end of a frame")
        return None

    def _take(self, n: int) -> bytes:
        pos = self._pos
        with memoryview(self._buf) as view:
            out = bytes(view[pos : pos + n])
        self._consume(n)
        return out

    def _consume(self, n: int) -> None:
        buf = self._buf
        end = self._pos + n
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > (len(buf) >> 1):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end


def frame(*parts: bytes) -> list[bytes]:
    """Size-prefix the concatenation of ``parts``; returns the pieces for ``writelines``."""
    size = 0
    for p in parts:
        size += len(p)
    return [_SIZE.pack(size), *parts]
